"""`agentkv bench quant --w4a16`: SmolLM2 as a compressed-tensors W4A16 checkpoint (group 128)
vs the same weights as a Q4_0 GGUF, in agentkv and in llama-cpp-python, one run.

Two W4A16 checkpoints, both written by agentkv.bench.quant_ckpt from the GGUF dequantized:
float32 scales (what the cpu backend holds in I4G32 blocks) and bfloat16 scales (what
llm-compressor writes for a bf16 model: f16-exact, so held exactly as Q4_0). Each arm runs in
a fresh process (`quant.worker`); memory held is the weight bytes the engine holds (see
quant_profile.tensor_bytes) over the checkpoint's tensor bytes. Targets: each W4A16 arm's
prefill and decode >= 0.9x agentkv's own Q4_0 figures; memory <= 1.1x."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentkv.bench import peers
from agentkv.bench.common import bar_plot, cache_dir, envelope, log, print_paths, table, write_outputs
from agentkv.bench.isolate import failed, why

SPEED_VS_Q4_0, MEMORY_TARGET = 0.9, 1.1
GROUP = 128
SPEEDS = ("prefill_tok_s", "decode_tok_s")


def checkpoints(model: str) -> dict[str, Path]:
    """arm -> the model path it runs; written once into the benchmarks' cache folder."""
    from agentkv.bench.quant_ckpt import write_q4_0_gguf, write_w4a16
    from agentkv.formats.resolve import resolve_model_path

    src, folder = resolve_model_path(model), cache_dir() / "w4a16"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"agentkv-q4_0": folder / f"{model}-q4_0.gguf"}
    if not paths["agentkv-q4_0"].exists():
        log(f"writing {paths['agentkv-q4_0']} ...")
        write_q4_0_gguf(paths["agentkv-q4_0"], src)
    for dtype, tag in (("float32", "f32"), ("bfloat16", "bf16")):
        path = folder / f"{model}-w4a16-g{GROUP}-{tag}-scales"
        if not (path / "model.safetensors").exists():
            log(f"writing {path} ...")
            write_w4a16(path, src, GROUP, dtype)
        paths[f"agentkv-w4a16-{tag}-scales"] = path
    paths["llamacpp-q4_0"] = paths["agentkv-q4_0"]
    return paths


def checkpoint_bytes(path: Path) -> int:
    """Tensor bytes of a GGUF or of a safetensors folder (headers excluded)."""
    if path.suffix == ".gguf":
        import gguf

        return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    from agentkv.formats.safetensors import read_header

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        header, _ = read_header(file)
        total += sum(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values())
    return total


def derive(results: dict, sizes: dict) -> dict:
    base = results.get("agentkv-q4_0", {})
    out: dict = {"vs_agentkv_q4_0": {}, "held_vs_checkpoint": {}, "verdicts": {}}
    for arm, r in results.items():
        if failed(r):
            continue
        if "weight_tensor_mib" in r:
            out["held_vs_checkpoint"][arm] = r["weight_tensor_mib"] * 2**20 / sizes[arm]
        if arm.startswith("agentkv-w4a16") and base and not failed(base):
            ratio = {k: r[k] / base[k] for k in SPEEDS}
            out["vs_agentkv_q4_0"][arm] = ratio
            mem = out["held_vs_checkpoint"][arm]
            out["verdicts"][arm] = {
                "speed": "met" if min(ratio.values()) >= SPEED_VS_Q4_0 else "missed",
                "memory": "met" if mem <= MEMORY_TARGET else "missed",
            }
    return out


def markdown(payload: dict) -> list[str]:
    la, lb = payload["load_average_before"], payload["load_average_after"]
    md = [f"load average before {la[0]:.1f}, after {lb[0]:.1f}; {payload['threads']} threads per arm", ""]
    rows, d = [], payload["derived"]
    for arm, r in payload["results"].items():
        if failed(r):
            rows.append([arm, why(r), "—", "—", "—"])
            continue
        rows.append(
            [arm, r["prefill_tok_s"], r["decode_tok_s"], r.get("weight_tensor_mib"), d["held_vs_checkpoint"].get(arm)]
        )
    md += table(["arm", "prefill tok/s", "decode tok/s", "weights held MiB", "held ÷ checkpoint"], rows) + [""]
    for arm, v in d["vs_agentkv_q4_0"].items():
        verdict = d["verdicts"][arm]
        md.append(
            f"- {arm} ÷ agentkv Q4_0: prefill ×{v['prefill_tok_s']:.2f}, decode ×{v['decode_tok_s']:.2f} "
            f"(target {SPEED_VS_Q4_0}×: {verdict['speed']}); memory {d['held_vs_checkpoint'][arm]:.2f}× "
            f"(target {MEMORY_TARGET}×: {verdict['memory']})"
        )
    return md


def run(args: argparse.Namespace) -> int:
    from agentkv.bench.forward import run_arms

    out, model = Path(args.out), args.models.split(",")[0]
    paths = checkpoints(model)
    base = {"backend": args.backend, "prompt_len": args.prompt_len, "decode_len": args.decode_len}
    base["repeats"] = args.repeats
    specs = {
        arm: {
            **base,
            "model": str(path),
            "arm": "llamacpp" if arm.startswith("llamacpp") else arm,
            "weights": "resident",
        }
        for arm, path in paths.items()
    }
    payload = envelope(
        "quant-w4a16",
        **base,
        model=model,
        group_size=GROUP,
        threads=peers.THREADS,
        llamacpp_build=peers.llamacpp_build(),
        load_average_before=os.getloadavg(),
        targets={"speed_vs_agentkv_q4_0": SPEED_VS_Q4_0, "memory_vs_checkpoint": MEMORY_TARGET},
        checkpoint_bytes={arm: checkpoint_bytes(p) for arm, p in paths.items()},
    )
    payload["results"] = run_arms("agentkv.bench.quant:worker", specs, out, args.arm_timeout)
    payload["load_average_after"] = os.getloadavg()
    payload["derived"] = derive(payload["results"], payload["checkpoint_bytes"])
    md = markdown(payload)
    groups = {
        arm: {f"{k.split('_')[0]} ×": x for k, x in v.items()}
        for arm, v in payload["derived"]["vs_agentkv_q4_0"].items()
    }
    png = bar_plot(out / "quant-w4a16.png", f"W4A16 g{GROUP} ÷ agentkv Q4_0 (same weights, same run)", groups, "×")
    if png:
        md.append(f"\n![quant-w4a16]({png.name})")
    paths_out = write_outputs(out, "quant-w4a16", payload, md)
    print_paths({**paths_out, **({"png": png} if png else {})})
    return 0
