"""Shared benchmark plumbing: machine facts, versions, timing and JSON output."""
from __future__ import annotations

import json
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

from agentkv.bench.report import git_commit, machine  # noqa: F401 (re-exported for the scripts)


def versions(*names: str) -> dict:
    out = {}
    for name in ("agentkv", "torch", "numpy", *names):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def timed(fn, repeats: int = 1) -> float:
    """Median wall seconds of `fn()` over `repeats` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20
