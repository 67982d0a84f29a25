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


def time_decode(engine, ids: list[int], decode_len: int) -> tuple[int, float]:
    """Greedy-decode `decode_len` tokens after `ids` on an agentkv engine: (tokens, seconds),
    timed from after the prefill step (which also yields the first token)."""
    from agentkv.runtime.params import SamplingParams

    engine.add_request("decode", ids, SamplingParams(max_tokens=decode_len + 1, temperature=0.0,
                                                       ignore_eos=True))
    engine.step()  # prefill + first token
    t0 = time.perf_counter()
    n = 0
    while engine.has_unfinished():
        n += len(engine.step())
    return n, time.perf_counter() - t0


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
