"""The pieces every benchmark shares: log line, stopwatch, decode timer, machine and version
facts, git commit, the output envelope, JSON/Markdown writing and the bar plot."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("agentkv", "torch", "numpy", "gguf", "transformers", "llama_cpp_python", "matplotlib")


CACHE_ENV = "AGENTKV_BENCH_CACHE"


def cache_dir() -> Path:
    """Where benchmarks keep the models they generate (never committed): $AGENTKV_BENCH_CACHE,
    else ~/.cache/agentkv/bench."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agentkv" / "bench")


def log(msg: str) -> None:
    """A timestamped progress line on stderr (stdout carries the report)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any], repeats: int = 1) -> float:
    """Median wall seconds of `fn()` over `repeats` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """Fastest wall seconds of `fn()` over `repeats` runs (prefill: the least disturbed run)."""
    return min(timed(fn) for _ in range(max(repeats, 1)))


def time_decode(engine, ids: list[int], decode_len: int) -> tuple[int, float]:
    """Greedy-decode `decode_len` tokens after `ids` on an agentkv engine: (tokens, seconds),
    timed from after the prefill step (which also yields the first token)."""
    from agentkv.runtime.params import SamplingParams

    engine.add_request(
        f"decode-{time.monotonic_ns()}",
        ids,
        SamplingParams(max_tokens=decode_len + 1, temperature=0.0, ignore_eos=True),
    )
    engine.step()  # prefill + first token
    t0 = time.perf_counter()
    n = 0
    while engine.has_unfinished():
        n += len(engine.step())
    return n, time.perf_counter() - t0


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    """`n` reproducible token ids below min(vocab, 20000), clear of the special ids."""
    import numpy as np

    return [int(x) for x in np.random.default_rng(seed).integers(100, min(vocab, 20000), n)]


def memory_mib() -> dict[str, float]:
    """RSS, private (USS) and shared (mostly file-backed mapped pages) of this process, MiB."""
    import psutil

    m = psutil.Process().memory_full_info()
    return {"rss": m.rss / 2**20, "uss": m.uss / 2**20, "shared": m.shared / 2**20}


def machine() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def envelope(benchmark: str, **fields: Any) -> dict[str, Any]:
    """The facts every output file starts with: what ran, when, where, at which commit."""
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
        "command": " ".join(["agentkv", *sys.argv[1:]]),
        "machine": machine(),
        "versions": versions(),
        **fields,
    }


def write_json(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table; floats get two decimals, None a dash."""
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(fmt(c) for c in row) + " |" for row in rows),
    ]


def header(payload: dict) -> list[str]:
    """The Markdown lines that say when, where and how a result was measured."""
    m = payload["machine"]
    return [
        f"# agentkv bench {payload['benchmark']} ({payload['date']}, commit {payload['commit']})",
        "",
        f"`{payload['command']}`",
        "",
        f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_avg'][0]:.1f}; versions: "
        f"{json.dumps(payload['versions'])}",
        "",
    ]


def write_outputs(out_dir: Path, stem: str, payload: dict, md: list[str]) -> dict[str, Path]:
    """OUT/stem.json and OUT/stem.md (the Markdown opens with `header(payload)`)."""
    paths = {"json": write_json(out_dir / f"{stem}.json", payload)}
    paths["md"] = out_dir / f"{stem}.md"
    paths["md"].write_text("\n".join(header(payload) + md) + "\n")
    return paths


def print_paths(paths: dict[str, Path]) -> None:
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")


def bar_plot(path: Path, title: str, groups: dict[str, dict[str, float | None]], ylabel: str) -> Path | None:
    """Grouped bars, `groups[panel][bar] = value`, one panel per group; None if nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {g: {k: v for k, v in bars.items() if v is not None} for g, bars in groups.items()}
    groups = {g: bars for g, bars in groups.items() if bars}
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.8), squeeze=False)
    for ax, (name, bars) in zip(axes[0], groups.items()):
        ax.bar(list(bars), list(bars.values()), color="tab:blue")
        ax.set(title=name, ylabel=ylabel)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_once(path: Path, write) -> Path:
    """`path`, written first by `write(partial)` when it does not exist: under a temporary
    name renamed at the end, so a half-written file never takes the name."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    try:
        write(partial)
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)
    return path
