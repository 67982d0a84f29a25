"""`agentkv bench soak`: does a server stay flat and correct over a long run of mixed traffic?

`agentkv serve` runs in a child process on a small KV pool with the disk tier, speculation,
two tenants and an admin key. Worker threads send what agents and bad clients send (chat,
streams, tool calls, Anthropic cache_control pins, aborts, slow readers, bad bodies) for
`--duration-s`; the server's RSS is sampled all along. Then the checks:

  rss        flat after warm-up: the last samples within 5% of the first after `--warmup-frac`
  5xx        none
  leaked     blocks still used once the cache is flushed (admin POST /flush_cache): 0
  integrity  the engine's check_integrity() at shutdown (its log line): ok
  answers    a sample of the greedy chat turns equals a cold server's (no cache) answers

Writes JSON, Markdown and a plot of RSS over time; exits 0 only when every check passed."""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from agentkv.bench.common import envelope, log, print_paths, save_figure, table, write_outputs
from agentkv.bench.load_server import ServerProcess, parse_metrics
from agentkv.bench.soak_traffic import KINDS, Sample

KEYS = ("soak-key-a", "soak-key-b")
ADMIN = "soak-admin"
RSS_TOLERANCE = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--duration-s", type=float, default=1800.0, help="traffic time (default 30 minutes)")
    parser.add_argument("--warmup-frac", type=float, default=0.2, help="share of the run before RSS must be flat")
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--kv-cache-blocks", type=int, default=96, help="a small pool: eviction and pins all run")
    parser.add_argument("--replay", type=int, default=12, help="greedy turns replayed on a cold server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/out")


def server_flags(args: argparse.Namespace, kv_dir: str) -> list[str]:
    keys = [flag for key in KEYS for flag in ("--api-key", key)]
    return [
        *("--kv-cache-blocks", str(args.kv_cache_blocks), "--kv-cache-dir", kv_dir, "--speculative", "suffix"),
        *("--max-model-len", "1024", "--max-queued-requests", "16", "--stream-stall-timeout", "30"),
        *("--served-model-name", "soak", "--admin-api-key", ADMIN, "--log-level", "info", *keys),
    ]


def drive(base: str, args: argparse.Namespace, deadline: float) -> tuple[Counter, list[Sample], list[str]]:
    """Worker threads sending weighted random traffic until `deadline`."""
    statuses: Counter = Counter()
    samples: list[Sample] = []
    errors: list[str] = []
    lock = threading.Lock()
    names = list(KINDS)
    weights = [KINDS[n][1] for n in names]

    def worker(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        while time.monotonic() < deadline:
            kind = rng.choices(names, weights)[0]
            try:
                status = KINDS[kind][0](base, KEYS[index % 2], rng, samples)
            except httpx.HTTPError as exc:
                with lock:
                    errors.append(f"{kind}: {exc!r}")
                continue
            with lock:
                statuses[(kind, status)] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses, samples, errors


def sample_rss(pid: int, period_s: float, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    proc, t0 = psutil.Process(pid), time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
        stop.wait(period_s)


def leaked_blocks(base: str) -> int:
    """Blocks still used once every request ended and the whole cache was flushed."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = parse_metrics(httpx.get(f"{base}/metrics", headers=admin, timeout=30).text)
        if m["agentkv_num_requests_running"] == 0 and m["agentkv_num_requests_waiting"] == 0:
            break
        time.sleep(0.2)
    httpx.post(f"{base}/flush_cache", headers=admin, timeout=60).raise_for_status()
    return int(parse_metrics(httpx.get(f"{base}/metrics", headers=admin, timeout=30).text)["agentkv_kv_blocks_used"])


def replay_cold(args: argparse.Namespace, samples: list[Sample], work: Path) -> tuple[int, int]:
    """(equal, compared) of greedy turns answered again by a server with no cache at all."""
    cold = ServerProcess(args.model, ["--no-prefix-cache", "--served-model-name", "soak", "--max-model-len", "1024"])
    cold.log_path = str(work / "cold.log")
    cold.start()
    equal = 0
    try:
        for s in samples[: args.replay]:
            body = {"model": "soak", "messages": s.messages, "max_tokens": 16, "temperature": 0}
            r = httpx.post(f"{cold.base}/v1/chat/completions", json=body, timeout=120)
            equal += (r.json()["choices"][0]["message"]["content"] or "") == s.text
    finally:
        cold.stop()
    return equal, min(len(samples), args.replay)


def rss_check(rss: list[tuple[float, float]], warmup_frac: float) -> dict:
    end = rss[-1][0]
    after = [mib for t, mib in rss if t >= warmup_frac * end] or [rss[-1][1]]
    base = after[0]
    return {
        "warm_mib": base,
        "final_mib": rss[-1][1],
        "max_after_warmup_mib": max(after),
        "growth_after_warmup": max(after) / base - 1,
    }


def plot(path: Path, rss: list[tuple[float, float]], warm_s: float, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot([t / 60 for t, _ in rss], [m for _, m in rss], color="tab:blue", label="server RSS")
    ax.axvline(warm_s / 60, color="gray", linestyle="--", label="end of warm-up")
    ax.set(xlabel="minutes", ylabel="MiB", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="agentkv-soak-"))
    server = ServerProcess(args.model, server_flags(args, str(work / "kv")), log_path=str(work / "server.log"))
    log(f"soak: starting the server (log {server.log_path})")
    server.start()
    rss: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(server.proc.pid, args.sample_s, stop, rss), daemon=True)
    sampler.start()
    log(f"soak: {args.clients} clients for {args.duration_s:.0f} s")
    t0 = time.monotonic()
    ticker = threading.Thread(target=_progress, args=(t0, args.duration_s, rss, stop), daemon=True)
    ticker.start()
    statuses, samples, errors = drive(server.base, args, t0 + args.duration_s)
    leaked = leaked_blocks(server.base)
    stop.set()
    server.stop()
    text = Path(server.log_path).read_text(errors="replace")
    integrity = "integrity at shutdown: ok" in text and "integrity at shutdown: FAILED" not in text
    equal, compared = replay_cold(args, samples, work)
    return _report(args, rss, statuses, errors, leaked, integrity, (equal, compared))


def _progress(t0: float, duration_s: float, rss: list, stop: threading.Event) -> None:
    while not stop.wait(60):
        log(f"  ... {time.monotonic() - t0:.0f} of {duration_s:.0f} s, server RSS {rss[-1][1]:.0f} MiB")


def _report(args, rss, statuses: Counter, errors, leaked: int, integrity: bool, replay) -> int:
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, status), n in sorted(statuses.items()):
        by_kind.setdefault(kind, {})[str(status)] = n
    num_5xx = sum(n for (_, status), n in statuses.items() if status >= 500)
    memory = rss_check(rss, args.warmup_frac)
    checks = {
        "rss_flat": memory["growth_after_warmup"] <= RSS_TOLERANCE,
        "no_5xx": num_5xx == 0 and not errors,
        "no_leaked_blocks": leaked == 0,
        "integrity": integrity,
        "answers_equal_cold": replay[1] > 0 and replay[0] == replay[1],
    }
    payload = envelope(
        "soak",
        duration_s=args.duration_s,
        clients=args.clients,
        requests=sum(statuses.values()),
        statuses=by_kind,
        num_5xx=num_5xx,
        connection_errors=errors[:20],
        leaked_blocks=leaked,
        memory=memory,
        rss=[[round(t, 1), round(m, 1)] for t, m in rss],
        replay={"equal": replay[0], "compared": replay[1]},
        checks=checks,
    )
    md = [f"# agentkv bench soak ({args.duration_s:.0f} s, {payload['requests']} requests)", ""]
    md += table(["check", "result"], [[k, "pass" if v else "FAIL"] for k, v in checks.items()])
    md += ["", f"RSS after warm-up {memory['warm_mib']:.0f} MiB -> max {memory['max_after_warmup_mib']:.0f} MiB"]
    md += table(["kind", "statuses"], [[k, v] for k, v in by_kind.items()])
    paths = write_outputs(Path(args.out), "soak", payload, md)
    paths["png"] = plot(Path(args.out) / "soak.png", rss, args.warmup_frac * rss[-1][0], "agentkv serve RSS under soak")
    print("\n".join(md))
    print_paths(paths)
    return 0 if all(checks.values()) else 1
