"""`agentkv bench long`: the long-context and agent-loop figures over HTTP, agentkv against
llama.cpp's own C++ server (`llama-server`: parallel slots, unified KV, its prompt cache;
llama_server.py) and, as a second arm, llama-cpp-python's OpenAI server (`llama_cpp.server`,
one slot, its prompt cache), on the same GGUF, 2 threads each, the same client
(long_client.py), ratios against the first peer that ran (llama-server) in one run.

Per model, each server in turn (never both at once, so they never share the cores): start
it (long_servers.py), one short warm-up request, the figures asked, stop it.

    replay   the tool loop (workloads.tool_loop): A agents x T turns over a P-token shared
             prefix, a turn's agents at once; wall time           target agentkv >= 8x lower
    fleet    the same agents, all at once, each its own turns in order (no turn barrier):
             wall time                                                          >= 4x lower
    ttft     a fresh L-token prompt (no cache hit): time to first token          >= 3x lower;
             its prefill tokens/s and the decode tokens/s of the next tokens at that depth
    decode   one stream, D tokens after a short prompt: tokens/s  >= 1.5x SmolLM2, 1.3x Gemma-3
    streams  N streams at once: aggregate tokens/s (and whether the server overlapped them)

Memory bandwidth is measured in this run, before and after the servers (quant.bandwidth_gbs,
the faster of the two); the decode ceiling is the GGUF's weight bytes per token over it, and
each decode figure is reported as a fraction of it (target >= 60%). replay, fleet and ttft run on
--context-models (the issue measures them on SmolLM2), decode and streams on --models.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from agentkv.bench import long_client as http
from agentkv.bench import long_prompts
from agentkv.bench.common import envelope, log
from agentkv.bench.engine import BENCH_KNOBS
from agentkv.bench.isolate import failed
from agentkv.bench.llama_server import (
    LlamaServer,
    build_facts,
    default_server_binary,
    fleet_flags,
    server_missing,
    system_info,
)
from agentkv.bench.long_prompts import Prompts, Sizes
from agentkv.bench.long_report import report
from agentkv.bench.long_servers import PeerServer, agentkv_server, peer_missing
from agentkv.bench.peers import THREADS, llamacpp_build, skipped

FIGURES = ("replay", "fleet", "ttft", "decode", "streams")
ARMS = ("agentkv", "agentkv-int8", "llama-server", "llamacpp")
DEFAULT_ARMS = "agentkv,llama-server,llamacpp"
PEERS = ("llama-server", "llamacpp")  # the ratios' peer: the first of these that ran
# the flags each agentkv arm adds to `agentkv serve`: each names its activation type, as the
# default ("auto") differs by CPU
ARM_FLAGS = {"agentkv": ["--activation-dtype", "f32"], "agentkv-int8": ["--activation-dtype", "int8"]}
SPEED_TARGETS = {"replay": 8.0, "fleet": 4.0, "ttft": 3.0}
DECODE_TARGETS = {"smollm2": 1.5, "gemma3-270m": 1.3}  # other models: the lower one
CEILING_TARGET = 0.6
CONTEXT_FIGURES = ("replay", "fleet", "ttft")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentkv.commands.config_flags import add_engine_arguments

    parser.add_argument("--figures", default=",".join(FIGURES), help=f"comma list of {', '.join(FIGURES)}")
    parser.add_argument("--models", default="smollm2,gemma3-270m", help="models of decode and streams")
    parser.add_argument("--context-models", default="smollm2", help="models of replay and ttft")
    parser.add_argument(
        "--arms",
        default=DEFAULT_ARMS,
        help=f"comma list of {', '.join(ARMS)} (agentkv: f32 matmul activations, agentkv-int8: int8; llamacpp: "
        f"llama_cpp.server; default {DEFAULT_ARMS})",
    )
    parser.add_argument(
        "--llama-server",
        default=str(default_server_binary()),
        metavar="PATH",
        help="llama.cpp's server binary (bench/build_llama_server.sh builds it; default %(default)s)",
    )
    add_engine_arguments(parser, knobs=BENCH_KNOBS, model_positional=False)
    parser.set_defaults(weights="resident")
    parser.add_argument(
        "--serve-arg", action="append", default=[], metavar="FLAG", help="one more flag for `agentkv serve`"
    )
    for name, default, what in (
        ("agents", 5, "replay: concurrent agents"),
        ("turns", 10, "replay: turns per agent"),
        ("prefix", 2048, "replay: shared system prompt, tokens"),
        ("user", 64, "replay: each agent's task, tokens"),
        ("answer", 32, "replay: answer tokens per turn"),
        ("tool", 128, "replay: tool result per later turn, tokens"),
        ("ttft-len", 8000, "ttft: fresh prompt, tokens"),
        ("depth-len", 32, "ttft: tokens decoded after it (decode speed at that depth)"),
        ("decode-len", 128, "decode and streams: tokens per stream"),
        ("short-len", 32, "decode and streams: prompt tokens"),
        ("streams", 16, "streams: concurrent streams"),
    ):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"{what} (default {default})")
    parser.add_argument(
        "--peer-streams",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the streams figure on llama_cpp.server too (it serves one request at a time)",
    )
    parser.add_argument("--out", default="bench/out")


def sizes(args: argparse.Namespace) -> Sizes:
    s = Sizes(
        args.agents,
        args.turns,
        args.prefix,
        args.user,
        args.answer,
        args.tool,
        args.ttft_len,
        args.depth_len,
        args.decode_len,
        args.short_len,
        args.streams,
    )
    s.check()
    return s


def choices(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [x for x in text.split(",") if x]
    for bad in [x for x in items if x not in allowed]:
        raise ValueError(f"{flag}: unknown {bad!r}; choose from {', '.join(allowed)}")
    return items


def plan(args: argparse.Namespace) -> dict[str, list[str]]:
    """model -> the figures it runs, in FIGURES order."""
    figures = choices(args.figures, FIGURES, "--figures")
    out: dict[str, list[str]] = {}
    for figure in [f for f in FIGURES if f in figures]:
        models = args.context_models if figure in CONTEXT_FIGURES else args.models
        for model in [m for m in models.split(",") if m]:
            out.setdefault(model, []).append(figure)
    if not out:
        raise ValueError(f"--figures {args.figures!r} with --models {args.models!r}: nothing to run")
    return out


def serve_flags(args: argparse.Namespace) -> list[str]:
    """The bench engine flags as `agentkv serve` spells them, then any --serve-arg."""
    from agentkv.commands.config_flags import FLAGS

    flags = []
    for knob in BENCH_KNOBS:
        if getattr(args, knob, None) is not None:
            flags += [FLAGS[knob].flag, str(getattr(args, knob))]
    return flags + list(args.serve_arg)


async def measure(base: str, model: str, figures: list[str], p: Prompts, s: Sizes) -> dict[str, Any]:
    """The figures on one running server (the warm-up first, not timed)."""
    await http.decode(base, model, p.warm_up, 4, repeats=1)
    out: dict[str, Any] = {}
    for figure in figures:
        log(f"  {figure} ...")
        if figure == "replay":
            out[figure] = await http.replay(base, model, p.segments, s.answer)
        elif figure == "fleet":
            out[figure] = await http.fleet(base, model, p.fleet, s.answer)
        elif figure == "ttft":
            out[figure] = await http.ttft(base, model, p.ttft, s.depth_len)
        elif figure == "decode":
            out[figure] = await http.decode(base, model, p.decode, s.decode_len)
        else:
            out[figure] = await http.streams(base, model, p.streams, s.decode_len)
        log(f"  {figure}: {brief(out[figure])}")
    return out


def brief(result: dict) -> str:
    keys = ("wall_s", "ttft_s", "decode_tok_s", "aggregate_tok_s", "max_concurrent")
    return ", ".join(f"{k} {result[k]:.3g}" for k in keys if isinstance(result.get(k), (int, float)))


def run_arm(arm: str, model: str, figures: list[str], p: Prompts, args: argparse.Namespace) -> dict[str, Any]:
    """Start `arm`'s server for `model`, measure, stop it. A peer that cannot run here is
    skipped; a server that fails is an error (its log named), never a pass."""
    import httpx

    from agentkv.formats.resolve import resolve_model_path

    log_path = Path(args.out) / f"long-{model}-{arm}.log"
    if arm == "llama-server":
        reason = server_missing(Path(args.llama_server))
        if reason:
            return skipped(reason)
        flags = fleet_flags(p.max_context, max(args.agents, 1))
        server = LlamaServer(Path(args.llama_server), str(resolve_model_path(model)), flags, log_path)
    elif arm == "llamacpp":
        if not args.peer_streams:
            figures = [f for f in figures if f != "streams"]
        reason = peer_missing()
        if reason:
            return skipped(reason)
        server = PeerServer(str(resolve_model_path(model)), p.max_context, log_path)
    else:
        server = agentkv_server(model, serve_flags(args) + ARM_FLAGS[arm], p.max_context, log_path)
    facts: dict[str, Any] = {"command": server.command[1:]}
    log(f"{model}: {arm}: starting its server ...")
    try:
        facts["start_s"] = server.start()
        if arm == "llama-server":
            facts["system_info"] = system_info(server.log_path)
        return {**facts, **asyncio.run(measure(server.base, model, figures, p, sizes(args)))}
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        return {**facts, "error": f"{type(exc).__name__}: {exc}", "log": str(server.log_path)}
    finally:
        server.stop()


def met(value: float | None, target: float | None) -> bool | None:
    return None if value is None or not target else value >= target


def ratio(num: float | None, den: float | None) -> float | None:
    return None if not num or not den else num / den


def derive(model: str, results: dict[str, dict], bw_gbs: float) -> dict[str, Any]:
    """The ceiling, each arm's decode fractions of it, and agentkv/peer per figure against
    its target (a ratio only where both arms ran that figure)."""
    from agentkv.bench.quant import gguf_facts

    facts = gguf_facts(model)
    ceiling = bw_gbs * 1e9 / facts["decode_bytes_per_token"]
    ok = {a: r for a, r in results.items() if not failed(r)}
    peer_name = next((p for p in PEERS if p in ok), None)
    peer = ok.get(peer_name, {})
    figs = {arm: over_peer(ok.get(arm, {}), peer) for arm in ARM_FLAGS}
    second = over_peer(ok.get("agentkv", {}), ok.get("llamacpp", {})) if peer_name != "llamacpp" else {}
    targets = {**SPEED_TARGETS, "decode": DECODE_TARGETS.get(model, min(DECODE_TARGETS.values())), "streams": None}
    of_ceiling = {
        arm: {
            "decode": ratio(r.get("decode", {}).get("decode_tok_s"), ceiling),
            "streams_aggregate": ratio(r.get("streams", {}).get("aggregate_tok_s"), ceiling),
            "decode_met": met(ratio(r.get("decode", {}).get("decode_tok_s"), ceiling), CEILING_TARGET),
        }
        for arm, r in ok.items()
    }
    return {
        "gguf_tensor_bytes": facts["tensor_bytes"],
        "decode_bytes_per_token": facts["decode_bytes_per_token"],
        "decode_ceiling_tok_s": ceiling,
        "of_ceiling": of_ceiling,
        "ceiling_target": CEILING_TARGET,
        "peer": peer_name,
        "ratios": {
            f: {
                "agentkv_over_peer": v,
                "target": targets[f],
                "met": met(v, targets[f]),
                "int8_over_peer": figs["agentkv-int8"][f],
                "int8_met": met(figs["agentkv-int8"][f], targets[f]),
                "agentkv_over_llama_cpp_server": second.get(f),
            }
            for f, v in figs["agentkv"].items()
        },
    }


def over_peer(ours: dict, peer: dict) -> dict[str, float | None]:
    """One agentkv arm against the peer, per figure (higher = agentkv faster)."""

    def get(r: dict, figure: str, key: str) -> float | None:
        return r.get(figure, {}).get(key)

    return {
        "replay": ratio(get(peer, "replay", "wall_s"), get(ours, "replay", "wall_s")),
        "fleet": ratio(get(peer, "fleet", "wall_s"), get(ours, "fleet", "wall_s")),
        "ttft": ratio(get(peer, "ttft", "ttft_s"), get(ours, "ttft", "ttft_s")),
        "decode": ratio(get(ours, "decode", "decode_tok_s"), get(peer, "decode", "decode_tok_s")),
        "streams": ratio(get(ours, "streams", "aggregate_tok_s"), get(peer, "streams", "aggregate_tok_s")),
    }


def run(args: argparse.Namespace) -> int:
    from agentkv.bench.quant import bandwidth_gbs

    arms = choices(args.arms, ARMS, "--arms")
    work, s = plan(args), sizes(args)
    load_before = os.getloadavg()
    log("measuring memory bandwidth ...")
    bw = [bandwidth_gbs()]
    models: dict[str, Any] = {}
    for model, figures in work.items():
        log(f"{model}: building prompts for {', '.join(figures)} ...")
        p = long_prompts.build(model, figures, s)
        results = {arm: run_arm(arm, model, figures, p, args) for arm in arms}
        models[model] = {"figures": figures, "max_context": p.max_context, "results": results}
    log("measuring memory bandwidth again ...")
    bw.append(bandwidth_gbs())
    best = max(bw, key=lambda b: b["best_gbs"])
    for model, block in models.items():
        block["derived"] = derive(model, block["results"], best["best_gbs"])
    payload = envelope(
        "long",
        threads=THREADS,
        sizes=s._asdict(),
        arms=arms,
        bandwidth={**best, "runs": bw},
        load_average={"before": load_before, "after": os.getloadavg()},
        llamacpp_build=llamacpp_build(),
        llama_server_build=build_facts(Path(args.llama_server)),
        isa=isa_facts(),
        serve_flags=serve_flags(args),
        targets={**SPEED_TARGETS, "decode": DECODE_TARGETS, "of_ceiling": CEILING_TARGET},
        models=models,
    )
    report(payload, Path(args.out))
    errors = [(m, a) for m, b in models.items() for a, r in b["results"].items() if "error" in r]
    return 1 if errors else 0


def isa_facts() -> dict[str, Any]:
    """The ISA agentkv's kernels run — AGENTKV_CPU_ISA when set (the servers inherit it), else
    the best the CPU has, as the kernels choose it (qmatmul512.cpp's cpu_supports) — the build
    of its int8 kernels under that ISA (qmatmul.cpp's int8_build) and the CPU's SIMD flags.
    Read from /proc/cpuinfo: never loads (or compiles) the kernels."""
    from agentkv.hal.kernels.loader import ISA_ENV, _cpu_flags

    flags = _cpu_flags(None) or set()
    best = "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2"
    forced = os.environ.get(ISA_ENV)
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    isa = forced or best
    int8 = "avx512-vnni" if isa == "avx512" and "avx512_vnni" in flags else "avx2"
    return {"agentkv_kernels": isa, "agentkv_int8_kernels": int8, "forced": forced, "cpu_flags": simd}
