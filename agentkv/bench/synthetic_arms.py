"""The two arms of the synthetic-GGUF benchmarks (`bench gptoss`, `bench mla`): agentkv in
its own process and llama.cpp's own `llama-server`, on the same file, THREADS threads each.

Each arm reports: load time; a first 512-token prefill of another prompt (it pages the mapped
weights in: reported, not in the ratios); the timed prefill and single-stream decode after it;
RSS; KV bytes per token; and, when `spec["long_len"]` is set, a decode after a prompt of that
many tokens (`long_prefill_tok_s`, `long_decode_tok_s`); when `spec["turn2"]` is set, an agent's
second turn on a transcript of `long_len` tokens with its prefix cache on (`turn2_ttft_s`, see
`TURN2`). `spec`: model, prompt_len, decode_len, vocab, long_len (0: none), turn2, activation_dtype
(agentkv's matmul input: f32, or int8 for the `agentkv-int8` arm that `--int8` adds)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

from agentkv.bench import peers
from agentkv.bench.common import log, memory_mib, prompt_ids

# An agent's second turn: turn 1 is a transcript of long_len tokens answered with REPLY tokens
# (greedy); turn 2 sends that transcript, the reply as sampled and TOOL_RESULT more tokens (a
# tool's answer), and its TTFT is the time to its first token. Both engines keep turn 1's state
# (agentkv: radix cache and snapshots; llama-server: its one slot and its prompt cache).
TURN2 = {"reply": 32, "tool_result": 64}
_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")


def context_len(spec: dict) -> int:
    """Tokens the longest request of `spec` needs (an engine's context for it)."""
    turn2 = TURN2["reply"] + TURN2["tool_result"] + 1 if spec.get("turn2") else 0
    return max(spec["prompt_len"], spec.get("long_len", 0)) + max(spec["decode_len"], turn2) + 32


def timed_decode(engine, ids: list[int], decode_len: int) -> tuple[float, int, float]:
    """Greedy `decode_len` tokens after `ids`: (prefill seconds, tokens after the first, their
    seconds). The prefill runs until the first token (a long prompt takes several chunks)."""
    from agentkv.runtime.params import SamplingParams

    params = SamplingParams(max_tokens=decode_len + 1, temperature=0.0, ignore_eos=True)
    engine.add_request(f"decode-{time.monotonic_ns()}", ids, params)
    t0 = time.perf_counter()
    while engine.has_unfinished() and not engine.step():
        pass
    t1 = time.perf_counter()
    n = 0
    while engine.has_unfinished():
        n += len(engine.step())
    return t1 - t0, n, time.perf_counter() - t1


def agentkv_arm(spec: dict) -> dict:
    """agentkv (cpu backend, resident weights, no prefix cache): see the module docstring."""
    import torch

    from agentkv.bench.engine import build_engine

    torch.set_num_threads(peers.THREADS)
    before = memory_mib()
    started = time.perf_counter()
    max_len = context_len(spec)
    args = SimpleNamespace(
        model=spec["model"], backend="cpu", weights="resident", activation_dtype=spec.get("activation_dtype", "f32")
    )
    engine = build_engine(args, prefix_cache=False, num_blocks=-(-max_len // 16) + 2, max_model_len=max_len)
    load_s = time.perf_counter() - started
    vocab, n = engine.vocab_size, spec["prompt_len"]
    first_s, _, _ = timed_decode(engine, prompt_ids(vocab, n, seed=1), 0)
    prefill_s, _, _ = timed_decode(engine, prompt_ids(vocab, n), 0)
    _, tokens, decode_s = timed_decode(engine, prompt_ids(vocab, n), spec["decode_len"])
    out = {
        "load_s": load_s,
        "first_prefill_s": first_s,
        "prefill_tok_s": n / prefill_s,
        "decode_tok_s": tokens / decode_s,
        "rss_mib": memory_mib()["rss"] - before["rss"],
        "kv_bytes_per_token": engine.model.kv_spec(1, 16).bytes_per_token,
        "kv_dtype": engine.backend.kv_dtype,
        "activation_dtype": engine.backend.activation_dtype,
        "kernels": engine.backend.identity.isa,
    }
    if spec.get("long_len"):
        long_s, tokens, decode_s = timed_decode(engine, prompt_ids(vocab, spec["long_len"], seed=2), spec["decode_len"])
        out |= {"long_prefill_tok_s": spec["long_len"] / long_s, "long_decode_tok_s": tokens / decode_s}
    if spec.get("turn2"):
        del engine
        engine = build_engine(args, prefix_cache=True, num_blocks=-(-max_len // 16) + 16, max_model_len=max_len)
        out |= agentkv_turn2(engine, prompt_ids(vocab, spec["long_len"], seed=3), prompt_ids(vocab, 64, seed=4))
    return out


def agentkv_turn2(engine, transcript: list[int], tool_result: list[int]) -> dict:
    """TURN2 on agentkv: turn 1 answers `transcript`, turn 2 adds the reply and `tool_result`."""
    from agentkv.runtime.params import SamplingParams

    params = SamplingParams(max_tokens=TURN2["reply"], temperature=0.0, ignore_eos=True)
    engine.add_request("turn1", transcript, params)
    t0 = time.perf_counter()
    reply: list[int] = []
    while engine.has_unfinished():
        reply += [t for o in engine.step() for t in o.token_ids]
    turn1_s = time.perf_counter() - t0
    second = transcript + reply + tool_result[: TURN2["tool_result"]]
    engine.add_request("turn2", second, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    t0 = time.perf_counter()
    outs = []
    while engine.has_unfinished() and not outs:
        outs = engine.step()
    ttft = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    cached = outs[0].cached_len if outs else None
    return {"turn1_s": turn1_s, "turn2_ttft_s": ttft, "turn2_prompt_tokens": len(second), "turn2_cached_tokens": cached}


def llama_server_arm(spec: dict, binary: Path, work: Path, timeout_s: float) -> dict:
    """llama-server (one slot, no prompt cache between the timed requests): its own timings."""
    import psutil

    from agentkv.bench.llama_server import LlamaServer

    if not binary.exists():
        return peers.skipped(f"no llama-server at {binary} (bench/build_llama_server.sh builds it)")
    work.mkdir(parents=True, exist_ok=True)
    n_ctx = context_len(spec)
    log_path = work / f"llama-server-{Path(spec['model']).stem}.log"
    server = LlamaServer(binary, spec["model"], ["-c", str(n_ctx), "-np", "1"], log_path)
    started = time.perf_counter()
    try:
        server.start(timeout_s)
    except (OSError, RuntimeError):
        server.stop()
        raise
    load_s = time.perf_counter() - started
    vocab, n, d = spec["vocab"], spec["prompt_len"], spec["decode_len"]

    def completion(ids: list[int], n_predict: int, cache: bool = False) -> dict:
        body = {"prompt": ids, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": cache, "temperature": 0.0}
        return server.post("/completion", body | ({"return_tokens": True, "id_slot": 0} if cache else {}))

    try:
        first = completion(prompt_ids(vocab, n, seed=1), 1)["timings"]
        pre, dec = completion(prompt_ids(vocab, n), 1)["timings"], completion(prompt_ids(vocab, n), d)["timings"]
        long = None
        if spec.get("long_len"):
            long = completion(prompt_ids(vocab, spec["long_len"], seed=2), d)["timings"]
        rss = psutil.Process(server.proc.pid).memory_info().rss / 2**20
        turn2 = {}
        if spec.get("turn2"):
            transcript = prompt_ids(vocab, spec["long_len"], seed=3)
            t0 = time.perf_counter()
            answer = completion(transcript, TURN2["reply"], cache=True)
            turn1_s = time.perf_counter() - t0
            second = transcript + answer["tokens"] + prompt_ids(vocab, 64, seed=4)[: TURN2["tool_result"]]
            timings = completion(second, 1, cache=True)["timings"]
            turn2 = {
                "turn1_s": turn1_s,
                "turn2_ttft_s": timings["prompt_ms"] / 1000.0,
                "turn2_prompt_tokens": len(second),
                "turn2_cached_tokens": timings.get("cache_n"),
            }
    finally:
        server.stop()
    out = {
        "load_s": load_s,
        "first_prefill_s": first["prompt_ms"] / 1000.0,
        "prefill_tok_s": pre["prompt_per_second"],
        "decode_tok_s": dec["predicted_per_second"],
        "rss_mib": rss,
        "kv_bytes_per_token": kv_bytes_per_token(log_path),
        "kernels": "llama-server",
    }
    if long is not None:
        out |= {"long_prefill_tok_s": long["prompt_per_second"], "long_decode_tok_s": long["predicted_per_second"]}
    return out | turn2


def kv_bytes_per_token(log_path: Path) -> float | None:
    """llama-server's KV cache bytes per token (cell), from its `llama_kv_cache: size = ...`
    log lines of its latest start (the log is appended run after run; summed where one start
    logs more than one cache, as gpt-oss's windowed and full layers), or None without one."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    text = text[text.rfind("llama_context: n_ctx") :]  # the latest start's context
    found = [(float(mib), int(cells)) for mib, cells in _KV_LINE.findall(text)]
    if not found:
        return None
    return sum(mib * 2**20 / cells for mib, cells in found if cells)


def add_arm_arguments(parser, rounds: int) -> None:
    """--int8 (an agentkv-int8 arm) and --rounds (default `rounds`), shared by the benchmarks."""
    parser.add_argument(
        "--int8", action="store_true", help="also run agentkv with int8 matmul activations (arm agentkv-int8)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=rounds,
        help="times every arm runs, the arms taking turns; figures are each arm's medians (default %(default)s)",
    )


def add_run_arguments(parser, out: str, rounds: int = 1, timeout_s: float = 3600.0) -> None:
    """What every synthetic benchmark takes after its shape and lengths: --int8 and --rounds
    (`add_arm_arguments`), --cache-dir, --llama-server, --arm-timeout and --out."""
    add_arm_arguments(parser, rounds)
    parser.add_argument("--cache-dir", default=None, help="where the synthetic GGUF is kept (default ~/.cache)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the cached build)")
    parser.add_argument("--arm-timeout", type=float, default=timeout_s, metavar="S")
    parser.add_argument("--out", default=out)


def run_both(
    spec: dict, out: Path, server_binary: str | None, timeout_s: float, int8: bool = False, rounds: int = 1
) -> dict:
    """agentkv's arm in its own process (and with `int8` its int8-activation arm,
    `agentkv-int8`, in another), then llama-server's, `rounds` times over (the arms take turns,
    so a drift of the machine's memory bandwidth meets every arm): arm name -> its result, the
    median of each figure over the rounds with the rounds themselves under "rounds" (a failure
    of any round is the arm's result, `{"error": ...}`)."""
    from agentkv.bench.isolate import run_isolated
    from agentkv.bench.llama_server import default_server_binary

    arms = (("agentkv", "f32"), ("agentkv-int8", "int8"))[: 1 + int8]
    binary = Path(server_binary) if server_binary else default_server_binary()
    runs: dict[str, list[dict]] = {arm: [] for arm, _ in arms} | {"llama-server": []}
    for r in range(rounds):
        for arm, dtype in arms:
            log(f"{arm} (round {r + 1} of {rounds}) ...")
            arm_spec = spec | {"activation_dtype": dtype}
            runs[arm].append(run_isolated(f"{__name__}:agentkv_arm", arm_spec, out / "runs", arm, timeout_s))
        log(f"llama-server (round {r + 1} of {rounds}) ...")
        try:
            runs["llama-server"].append(llama_server_arm(spec, binary, out / "runs" / "llama-server", timeout_s))
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            runs["llama-server"].append({"error": f"llama-server {binary}: {exc}"})
    return {arm: medians(results) for arm, results in runs.items()}


def medians(results: list[dict]) -> dict:
    """One arm's rounds as one result: the first failure if any failed; else each numeric
    figure's median (the others from the first round), with the rounds under "rounds"."""
    import statistics

    from agentkv.bench.isolate import failed

    broken = [r for r in results if failed(r)]
    if broken:
        return broken[0]
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in results if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(values)
    return out | {"rounds": results}


def speed_ratios(results: dict, keys: tuple[str, ...], arm: str = "agentkv") -> dict[str, float]:
    """`arm` ÷ llama-server for each of `keys` both arms measured ({} unless both ran)."""
    from agentkv.bench.isolate import failed

    ours, theirs = results.get(arm, {}), results.get("llama-server", {})
    if failed(ours) or failed(theirs) or not ours or not theirs:
        return {}
    return {k: ours[k] / theirs[k] for k in keys if ours.get(k) and theirs.get(k)}


def measured_payload(benchmark: str, shape, path: Path, args, speeds: tuple[str, ...]) -> dict:
    """Both arms on the synthetic GGUF `path` of `shape` (a dataclass with `top_k` and
    `vocab`), with the memory bandwidth, the decode bytes per token and the load average
    around the run: the benchmark's JSON payload."""
    import os
    from dataclasses import asdict

    from agentkv.bench.common import envelope
    from agentkv.bench.isolate import failed
    from agentkv.bench.moe import decode_bytes, verdict
    from agentkv.bench.quant import SPEED_TARGET, bandwidth_gbs

    log("measuring memory bandwidth ...")
    bw = bandwidth_gbs()
    spec = {"model": str(path), "prompt_len": args.prompt_len, "decode_len": args.decode_len, "vocab": shape.vocab}
    spec["long_len"] = getattr(args, "long_len", 0)
    spec["turn2"] = bool(getattr(args, "turn2", False) and spec["long_len"])
    load_before = os.getloadavg()
    rounds = args.rounds
    results = run_both(spec, Path(args.out), args.llama_server, args.arm_timeout, args.int8, rounds)
    facts = decode_bytes(path, shape.top_k)
    file_mib = path.stat().st_size / 2**20
    vs = speed_ratios(results, speeds)
    ratios = {"vs_llama_server": vs}
    if "agentkv-int8" in results:
        ratios["int8_vs_llama_server"] = speed_ratios(results, speeds, "agentkv-int8")
    default = default_arm()
    default_vs = ratios.get("int8_vs_llama_server" if default == "agentkv-int8" else "vs_llama_server", {})
    if rounds > 1:  # each round's own ratios: how far the medians' ratio is from any one round's
        for arm in (a for a in results if a != "llama-server"):
            turns = zip(results[arm].get("rounds", []), results["llama-server"].get("rounds", []))
            ratios[f"{arm}_by_round"] = [speed_ratios({arm: a, "llama-server": b}, speeds, arm) for a, b in turns]
    return envelope(
        benchmark,
        model=str(path),
        shape=asdict(shape),
        file_mib=file_mib,
        gguf=facts,
        threads=peers.THREADS,
        rounds=rounds,
        bandwidth=bw,
        decode_ceiling_tok_s=bw["best_gbs"] * 1e9 / facts["decode_bytes_per_token"],
        rss_over_file={a: r["rss_mib"] / file_mib for a, r in results.items() if not failed(r)},
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        results=results,
        ratios=ratios,
        targets={"speed_vs_llama_server": SPEED_TARGET, "rss_over_file": 1.1},
        speed_verdict=verdict(vs) if vs else "not measured",
        default_arm=default,
        default_speed_verdict=verdict(default_vs) if default_vs else "not measured",
    )


def default_arm() -> str:
    """The arm that runs as `agentkv serve` does by default here: the cpu backend's own "auto"
    choice (under the same AGENTKV_CPU_ISA as the arms' processes)."""
    from agentkv.hal.registry import lookup

    return "agentkv-int8" if lookup("cpu", "f32", "auto").activation_dtype == "int8" else "agentkv"


def publish(payload: dict, md: list[str], title: str, speeds: tuple[str, ...], out: Path) -> None:
    """The payload's JSON, its Markdown and a bar plot of `speeds` per arm into `out`."""
    from agentkv.bench.common import bar_plot, print_paths, write_outputs
    from agentkv.bench.isolate import failed

    name = payload["benchmark"]
    groups = {k: {a: r.get(k) for a, r in payload["results"].items() if not failed(r)} for k in speeds}
    png = bar_plot(out / f"{name}.png", title, groups, "tok/s")
    if png:
        md.append(f"\n![{name}]({png.name})")
    print_paths({**write_outputs(out, name, payload, md), **({"png": png} if png else {})})


def model_line(payload: dict, model: str) -> str:
    """The Markdown's first line: the model, the file, the decode ceiling, the load around the run."""
    bw, g = payload["bandwidth"], payload["gguf"]
    return (
        f"model: synthetic {model} {payload['shape']}, GGUF {payload['file_mib'] / 1024:.2f} GiB; decode reads "
        f"{g['decode_bytes_per_token'] / 2**20:.0f} MiB per token -> ceiling {payload['decode_ceiling_tok_s']:.1f} "
        f"tok/s at {bw['best_gbs']:.1f} GB/s; load average before {payload['load_average_before'][0]:.1f}, after "
        f"{payload['load_average_after'][0]:.1f}; {payload['threads']} threads per engine; {rounds_line(payload)}"
    )


def rounds_line(payload: dict) -> str:
    rounds = payload.get("rounds", 1)
    if rounds == 1:
        return "one run each"
    return f"{rounds} rounds, the arms taking turns; each figure is an arm's median over the rounds"


def arm_ratio_lines(payload: dict, keys: tuple[str, ...]) -> list[str]:
    """The int8 arm's ratios to llama-server (with --int8), then a line per agentkv arm with its
    ratios round by round (none for one round)."""
    lines = []
    int8 = payload["ratios"].get("int8_vs_llama_server")
    if int8:
        ratio = ", ".join(f"{k.replace('_tok_s', '')} ×{v:.2f}" for k, v in int8.items())
        lines.append(f"- agentkv-int8 (int8 matmul activations) ÷ llama-server: {ratio}")
    if "default_arm" in payload:
        lines.append(
            f"- the default (`--activation-dtype auto`) here is arm {payload['default_arm']}: "
            f"{payload['default_speed_verdict']}"
        )
    for name, by_round in payload["ratios"].items():
        if not name.endswith("_by_round") or not by_round:
            continue
        arm = name.removesuffix("_by_round")
        cells = [", ".join(f"×{r[k]:.2f}" for r in by_round if k in r) for k in keys]
        lines.append(f"- {arm} ÷ llama-server round by round: " + "; ".join(f"{k} {c}" for k, c in zip(keys, cells)))
    return lines
