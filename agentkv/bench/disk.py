"""`agentkv bench disk`: time to first token for an agent prefix after a restart, in one run.

  cold       a fresh process, nothing cached: the whole prefix is computed; its close()
             writes every block back to the disk tier (timed: the write bandwidth)
  warm-disk  a fresh process on the same --kv-cache-dir: the prefix's blocks come from disk
             (checksummed, every header field checked) and one token is computed
  llama.cpp  `llama-server --slot-save-path`: a first server computes the prefix and saves
             slot 0; a second server restores it (POST /slots/0?action=restore) and answers;
             without a llama-server binary, llama-cpp-python's llama_state_seq_save_file /
             llama_state_seq_load_file (what slot save/restore calls), said in the output
  read       the disk tier alone reading and verifying every block of the prefix, with the
             files dropped from the page cache first (fsync + POSIX_FADV_DONTNEED)

Every arm runs in its own interpreter (agentkv.bench.isolate): a restart is a new process.
TTFT excludes loading the model (both engines are up, warmed by one short request, and idle
when the clock starts; llama-server warms itself up at start). The first
token and its logprob of the warm arm must equal the cold arm's, or the run fails (exit 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.disk_llamacpp import llamacpp_arm
from agentkv.bench.engine import add_engine_flags
from agentkv.bench.isolate import failed, run_isolated, why
from agentkv.bench.workloads import lcg

BLOCK_SIZE = 16
SEED = 7001  # of the prefix's lcg tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_flags(parser)
    parser.add_argument("--prefix-len", type=int, default=4096, help="agent prefix tokens (default 4096)")
    parser.add_argument("--kv-cache-dir", default=None, help="disk tier directory (default: a fresh temporary one)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the cached build)")
    parser.add_argument(
        "--arm-timeout", type=float, default=1800, metavar="S", help="stop an arm after S seconds (skipped)"
    )
    parser.add_argument("--out", default="bench/out")


def _engine(spec: dict):
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine

    knobs = {k: spec[k] for k in ("backend", "weights") if spec.get(k) is not None}
    num_blocks = spec["prefix_len"] // BLOCK_SIZE + 8
    config = engine_config(
        spec["model"], **knobs, kv_cache_dir=spec["dir"], kv_cache_blocks=num_blocks, block_size=BLOCK_SIZE
    )
    return Engine(config)


def _first_token(engine, ids: list[int]) -> dict:
    """Greedy first token of `ids` on an idle engine: TTFT, the token and its logprob."""
    from agentkv.runtime.params import SamplingParams

    t0 = time.perf_counter()
    engine.add_request(f"agent-{len(ids)}", ids, SamplingParams(max_tokens=1, temperature=0.0, logprobs=1))
    out = None
    while out is None or not out.token_ids:
        outs = engine.step()
        out = outs[0] if outs else out
    ttft = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    return {"ttft_s": ttft, "token": out.token_ids[0], "logprob": out.logprobs[0].logprob, "cached": out.cached_len}


def agentkv_arm(spec: dict) -> dict:
    """One restart of the engine on `spec["dir"]`: its TTFT, then (cold) the timed write-back."""
    engine = _engine(spec)
    ids = lcg(spec["prefix_len"], SEED, engine.vocab_size)
    _first_token(engine, lcg(BLOCK_SIZE // 2, 1, engine.vocab_size))  # warm-up: less than a block, no file
    result = {**_first_token(engine, ids), "vocab": engine.vocab_size}
    t0 = time.perf_counter()
    engine.close()  # write-back of every cached block, flushed: what SIGTERM runs
    close_s = time.perf_counter() - t0
    stats = engine.disk.stats()
    result.update(
        close_s=close_s,
        written_blocks=stats.written_blocks,
        bytes_written=stats.bytes_written,
        hit_blocks=stats.hit_blocks,
        bytes_read=stats.bytes_read,
        ignored_files=stats.ignored_files,
    )
    if stats.bytes_written:
        result["write_mb_s"] = stats.bytes_written / close_s / 1e6
    return result


def _no_writes(block: int) -> bytes:
    raise RuntimeError(f"the read arm offered block {block}: it only reads (bug)")


def read_arm(spec: dict) -> dict:
    """The disk tier alone: read and verify every block of the prefix, page cache dropped."""
    from agentkv.cache.disk_tier import DiskTier
    from agentkv.runtime.kv_disk import tenant_of

    engine = _engine(spec)
    ids = lcg(spec["prefix_len"], SEED, engine.vocab_size)
    disk, namespace = engine.disk.tier, (engine.model_name, None)
    files = sorted(disk.dir.glob("g-*/*.kvb"))
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    tier = DiskTier(disk.dir.parent, disk.fingerprint, disk.capacity_bytes, _no_writes, tenant_of)
    num_blocks = (len(ids) - 1) // BLOCK_SIZE
    t0 = time.perf_counter()
    payloads = tier.fetch(namespace, ids, 0, num_blocks)
    read_s = time.perf_counter() - t0
    tier.close()
    stats = tier.stats()
    return {
        "blocks": len(payloads),
        "bytes_read": stats.bytes_read,
        "read_s": read_s,
        "read_mb_s": stats.bytes_read / read_s / 1e6,
        "files": len(files),
    }


def _arms(args: argparse.Namespace, spec: dict, work: Path) -> dict[str, dict]:
    arms: dict[str, dict] = {}
    for name, target in (("cold", "agentkv_arm"), ("warm-disk", "agentkv_arm"), ("read", "read_arm")):
        log(f"arm {name}")
        arms[name] = run_isolated(f"agentkv.bench.disk:{target}", spec, work, name, args.arm_timeout)
    log("arm llama.cpp")
    if failed(arms["cold"]):
        arms["llama.cpp"] = {"skipped": "the cold arm failed (it gives the vocabulary size)"}
    else:
        peer_spec = {**spec, "vocab": arms["cold"]["vocab"], "seed": SEED}
        arms["llama.cpp"] = llamacpp_arm(peer_spec, args.llama_server, work, args.arm_timeout)
    return arms


def problems(arms: dict[str, dict], prefix_len: int) -> list[str]:
    """What makes the run not a result: a failed agentkv arm, an inexact or missing warm hit."""
    bad = [f"{n}: {why(r)}" for n, r in arms.items() if n != "llama.cpp" and failed(r)]
    if bad:
        return bad
    cold, warm = arms["cold"], arms["warm-disk"]
    if (warm["token"], warm["logprob"]) != (cold["token"], cold["logprob"]):
        bad.append(f"warm first token {warm['token']} ({warm['logprob']!r}) != cold {cold['token']}")
    if cold["cached"] != 0 or warm["cached"] != (prefix_len - 1) // BLOCK_SIZE * BLOCK_SIZE:
        bad.append(f"cached tokens cold {cold['cached']}, warm {warm['cached']}")
    return bad


def _report(arms: dict[str, dict], spec: dict) -> list[str]:
    cold, warm, read, peer = arms["cold"], arms["warm-disk"], arms["read"], arms["llama.cpp"]
    rows = [
        ["agentkv cold (computes the prefix)", cold["ttft_s"], cold["cached"], "—"],
        ["agentkv warm from disk", warm["ttft_s"], warm["cached"], warm["token"] == cold["token"]],
    ]
    if failed(peer):
        rows.append(["llama.cpp", None, None, why(peer)])
    else:
        rows.append([f"llama.cpp cold ({peer['how']})", peer["cold_ttft_s"], 0, "—"])
        restored = [peer["warm_ttft_s"], peer.get("restored_tokens"), peer["same_first_token"]]
        rows.append([f"llama.cpp restored ({peer['how']})", *restored])
    md = table(["arm", "TTFT s", "cached tokens", "same first token as cold"], rows) + [""]
    md += [
        f"- prefix: {spec['prefix_len']} lcg tokens (seed {SEED}) on {spec['model']}, block size {BLOCK_SIZE}; "
        "each arm a fresh process, TTFT excludes model load; the warm arms read files the page cache may "
        "still hold (a process restart, not a machine restart)",
        f"- disk tier write (close: read blocks, encode, write, rename, flush): {cold['bytes_written'] / 1e6:.1f} MB "
        f"in {cold['close_s']:.2f} s = {cold.get('write_mb_s', 0):.0f} MB/s",
        f"- disk tier read + verify, page cache dropped: {read['bytes_read'] / 1e6:.1f} MB in "
        f"{read['read_s']:.2f} s = {read['read_mb_s']:.0f} MB/s ({read['blocks']} blocks)",
    ]
    if not failed(peer):
        md.append(
            f"- llama.cpp: {peer['note']}; its saved state {(peer.get('state_bytes') or 0) / 1e6:.1f} MB (its KV "
            f"type, f16 by default) against agentkv's {cold['bytes_written'] / 1e6:.1f} MB of f32 KV blocks"
        )
    return md


def run(args: argparse.Namespace) -> int:
    if args.prefix_len < 2 * BLOCK_SIZE:
        raise ValueError(f"--prefix-len {args.prefix_len} must be >= {2 * BLOCK_SIZE}")
    out = Path(args.out)
    if args.kv_cache_dir and any(Path(args.kv_cache_dir).glob("kv-v*/g-*/*.kvb")):
        raise ValueError(f"--kv-cache-dir {args.kv_cache_dir} already holds block files; the cold arm needs none")
    scratch = Path(tempfile.mkdtemp(prefix="agentkv-bench-disk-"))  # arm specs, slot files, default KV dir
    spec = {"model": args.model, "backend": args.backend, "weights": args.weights, "prefix_len": args.prefix_len}
    spec["dir"] = args.kv_cache_dir or str(scratch / "kv")
    try:
        arms = _arms(args, spec, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # hundreds of MB of KV: never left behind
    payload = envelope("disk", model=args.model, prefix_len=args.prefix_len, arms=arms)
    bad = problems(arms, args.prefix_len)
    md = [f"FAILED: {b}" for b in bad] if bad else _report(arms, spec)
    png = None
    if not bad:
        ttft = {"agentkv cold": arms["cold"]["ttft_s"], "agentkv warm disk": arms["warm-disk"]["ttft_s"]}
        if not failed(arms["llama.cpp"]):
            ttft["llama.cpp cold"] = arms["llama.cpp"]["cold_ttft_s"]
            ttft["llama.cpp restored"] = arms["llama.cpp"]["warm_ttft_s"]
        bw = {"write": arms["cold"].get("write_mb_s"), "read + verify": arms["read"]["read_mb_s"]}
        groups = {f"TTFT, {args.prefix_len}-token prefix after a restart": ttft, "disk tier MB/s": bw}
        png = bar_plot(out / "disk.png", "agentkv disk tier (same run)", groups, "s  |  MB/s")
        md.append(f"\n![disk]({png.name})" if png else "")
    paths = write_outputs(out, "disk", payload, md)
    if png:
        paths["png"] = png
    print_paths(paths)
    if bad:
        print(f"FAILED: {bad}", file=sys.stderr)
        return 1
    return 0
