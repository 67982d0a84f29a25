"""Benchmarks of agent workloads against peers (never imported by the core)."""
from agentkv.bench.workloads import WORKLOADS, Workload, build, lcg, session_formulas

__all__ = ["WORKLOADS", "Workload", "build", "lcg", "session_formulas"]
