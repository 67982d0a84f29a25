"""Shared benchmark plumbing: machine facts, versions, timing and JSON output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path


def machine() -> dict:
    import psutil

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": sys.version.split()[0], "platform": platform.platform()}


def versions(*names: str) -> dict:
    out = {}
    for name in ("agentkv", "torch", "numpy", *names):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


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
