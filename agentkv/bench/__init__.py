"""Benchmarks of agentkv against its peers (never imported by the core): one module per
`agentkv bench` subcommand, the peers, and the pieces they share."""

from agentkv.bench.workloads import WORKLOADS, Workload, build, lcg, session_formulas

__all__ = ["WORKLOADS", "Workload", "build", "lcg", "session_formulas"]
