"""`agentkv bench quant`: resident quantized weights vs llama.cpp on the same GGUF, one run.

Per model and arm (each in a fresh process, THREADS threads): prefill and decode tokens/s
(see `forward`) and the memory the process grew by. Against them: the GGUF's tensor bytes
(memory target: agentkv holds <= 1.15x) and the decode bandwidth ceiling, weight bytes read
per token / memory bandwidth measured in this run. Targets: agentkv >= 1.5x llama.cpp on
prefill and decode; --profile adds a cProfile of agentkv's steps split by kernel.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentkv.bench import peers
from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, timed, write_outputs
from agentkv.bench.forward import add_speed_flags, measure_agentkv, measure_peer, run_arms
from agentkv.bench.isolate import failed, why
from agentkv.commands.config_flags import add_engine_arguments

SPEED_TARGET, SPEED_FLOOR, MEMORY_TARGET = 1.5, 1.0, 1.15
ARMS = ("agentkv-resident", "llamacpp", "agentkv-f32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smollm2,gemma3-270m", help="comma list of models")
    parser.add_argument("--arms", default="agentkv-resident,llamacpp", help=f"comma list of {', '.join(ARMS)}")
    add_engine_arguments(parser, knobs=("backend",), model_positional=False)
    add_speed_flags(parser)
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="cProfile agentkv's prefill and decode steps, split by kernel",
    )
    parser.add_argument(
        "--w4a16",
        action="store_true",
        help="instead: the first model as a W4A16 g128 safetensors checkpoint vs Q4_0 (quant_w4a16)",
    )
    parser.add_argument("--out", default="bench/out")


def worker(spec: dict) -> dict:
    """One arm on one model: speeds, memory and, for agentkv, the weights it holds."""
    from agentkv.bench.quant_profile import profile_agentkv, tensor_bytes

    if spec["arm"] == "llamacpp":
        return measure_peer(spec)
    out, engine = measure_agentkv(spec)
    out["weight_tensor_mib"] = tensor_bytes(engine.model) / 2**20
    if spec.get("profile"):
        from agentkv.bench.common import prompt_ids

        out["profile"] = profile_agentkv(engine, prompt_ids(engine.vocab_size, spec["prompt_len"]))
    return out


def bandwidth_gbs(repeats: int = 5) -> dict:
    """Memory bandwidth of this machine now: torch sum over 1 GiB of f32, 2 threads."""
    import torch

    torch.set_num_threads(2)
    x = torch.ones(2**28)
    x.sum()
    times = sorted(timed(x.sum) for _ in range(repeats))
    return {"best_gbs": 2**30 / times[0] / 1e9, "median_gbs": 2**30 / times[len(times) // 2] / 1e9}


def gguf_facts(model: str) -> dict:
    """Tensor bytes of the GGUF, by type, and the weight bytes one decode token reads (every
    tensor once; a tied token_embd is read whole as the output head, an untied one by a row)."""
    import gguf

    from agentkv.formats.resolve import resolve_model_path

    reader = gguf.GGUFReader(str(resolve_model_path(model)))
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    names = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(names.values())
    per_token = total - (names.get("token_embd.weight", 0) if "output.weight" in names else 0)
    return {"tensor_bytes": total, "bytes_by_type": by_type, "decode_bytes_per_token": per_token}


def derive(results: dict, facts: dict, bw: float) -> dict:
    """Ceiling, ceiling fractions, memory ratios and the ratios vs llama.cpp for one model."""
    ceiling = bw * 1e9 / facts["decode_bytes_per_token"]
    out: dict = {"decode_ceiling_tok_s": ceiling, "of_ceiling": {}, "memory_vs_gguf": {}}
    for arm, r in results.items():
        if failed(r):
            continue
        out["of_ceiling"][arm] = r["decode_tok_s"] / ceiling
        out["memory_vs_gguf"][arm] = r["resident_mib"] * 2**20 / facts["tensor_bytes"]
        if "weight_tensor_mib" in r:  # the target's measure: the weights the engine holds
            out.setdefault("weights_vs_gguf", {})[arm] = r["weight_tensor_mib"] * 2**20 / facts["tensor_bytes"]
    ours, peer = results.get("agentkv-resident", {}), results.get("llamacpp", {})
    if ours and peer and not failed(ours) and not failed(peer):
        out["vs_llamacpp"] = {k: ours[k] / peer[k] for k in ("prefill_tok_s", "decode_tok_s")}
        worst = min(out["vs_llamacpp"].values())
        out["speed_verdict"] = (
            "met" if worst >= SPEED_TARGET else "missed (>= 1.0x)" if worst >= SPEED_FLOOR else "missed (< 1.0x)"
        )
    mem = out.get("weights_vs_gguf", {}).get("agentkv-resident")
    if mem is not None:
        out["memory_verdict"] = "met" if mem <= MEMORY_TARGET else "missed"
    return out


def markdown(payload: dict) -> list[str]:
    bw = payload["bandwidth"]
    md = [
        f"memory bandwidth {bw['best_gbs']:.1f} GB/s best, {bw['median_gbs']:.1f} median; load "
        f"average before {payload['load_average_before'][0]:.1f}, after "
        f"{payload['load_average_after'][0]:.1f}; {payload['threads']} threads per engine",
        "",
    ]
    rows = []
    for model, block in payload["models"].items():
        d = block["derived"]
        for arm, r in block["results"].items():
            rows.append(
                [model, arm, why(r)] + ["—"] * 4
                if failed(r)
                else [
                    model,
                    arm,
                    r["prefill_tok_s"],
                    r["decode_tok_s"],
                    d["of_ceiling"][arm],
                    r["resident_mib"],
                    r.get("weight_tensor_mib"),
                ]
            )
    md += table(
        ["model", "arm", "prefill tok/s", "decode tok/s", "of ceiling", "RSS growth MiB", "weights held MiB"], rows
    ) + [""]
    for model, block in payload["models"].items():
        d = block["derived"]
        if "vs_llamacpp" in d:
            v = d["vs_llamacpp"]
            md.append(
                f"- {model}: agentkv ÷ llama.cpp prefill ×{v['prefill_tok_s']:.2f}, decode "
                f"×{v['decode_tok_s']:.2f} (target {SPEED_TARGET}×: {d['speed_verdict']})"
            )
        md.append(
            f"- {model}: GGUF tensors {block['gguf']['tensor_bytes'] / 2**20:.1f} MiB, decode "
            f"ceiling {d['decode_ceiling_tok_s']:.0f} tok/s, memory {d.get('memory_verdict', '—')}"
        )
    return md


def run(args: argparse.Namespace) -> int:
    if args.w4a16:
        from agentkv.bench import quant_w4a16

        return quant_w4a16.run(args)
    arms = [a for a in args.arms.split(",") if a]
    for bad in [a for a in arms if a not in ARMS]:
        raise ValueError(f"--arms: unknown arm {bad!r}; choose from {', '.join(ARMS)}")
    log("measuring memory bandwidth ...")
    bw = bandwidth_gbs()
    base = {
        "backend": args.backend,
        "prompt_len": args.prompt_len,
        "decode_len": args.decode_len,
        "repeats": args.repeats,
        "profile": args.profile,
    }
    payload = envelope(
        "quant",
        **base,
        threads=peers.THREADS,
        bandwidth=bw,
        llamacpp_build=peers.llamacpp_build(),
        load_average_before=os.getloadavg(),
        targets={"speed_vs_llamacpp": SPEED_TARGET, "memory_vs_gguf": MEMORY_TARGET},
        models={},
    )
    out = Path(args.out)
    for model in [m for m in args.models.split(",") if m]:
        specs = {
            f"{model}-{arm}": {
                **base,
                "model": model,
                "arm": arm,
                "weights": arm.split("-", 1)[1] if "-" in arm else None,
            }
            for arm in arms
        }
        found = run_arms("agentkv.bench.quant:worker", specs, out, args.arm_timeout)
        results = {arm: found[f"{model}-{arm}"] for arm in arms}
        facts = gguf_facts(model)
        payload["models"][model] = {
            "gguf": facts,
            "results": results,
            "derived": derive(results, facts, bw["best_gbs"]),
        }
    payload["load_average_after"] = os.getloadavg()
    md = markdown(payload)
    groups = {
        model: {f"{k.split('_')[0]} ×": v for k, v in b["derived"].get("vs_llamacpp", {}).items()}
        for model, b in payload["models"].items()
    }
    png = bar_plot(out / "quant.png", "agentkv ÷ llama.cpp (same GGUF, same run; higher = agentkv faster)", groups, "×")
    if png:
        md.append(f"\n![quant]({png.name})")
    paths = write_outputs(out, "quant", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0
