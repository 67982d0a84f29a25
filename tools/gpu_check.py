"""The driver of tools/gpu_check.sh: the `cuda` backend on a CUDA device, one JSON file.

    python tools/gpu_check.py --out DIR [--skip-bench]

Sections (each timed, each an error string instead of its result if it raised):
- env: torch, Triton, the device, the backend's identity;
- witness: every op case of agentkv/witness/ops.py against the reference (cosine, status),
  and whole-model rows on random SmolLM2- and Gemma-3-shaped models (transformers, random);
- exactness: the same row-invariance and model-split checks the interpreter tests run
  (tests/hal/cuda_interp.py), here on the device;
- moe: the tiny Qwen3-MoE and MXFP4 gpt-oss of tests/hal/cuda_interp_moe.py (moe_checks);
- sync: a decode step's forward under torch.cuda.set_sync_debug_mode("error"), and the host
  reads counted by agentkv.witness.host_sync.HostReads;
- bench: prefill (512 tokens) and greedy decode (64 tokens) tokens/s of a SmolLM2-135M-shaped
  random f32 model: the `cuda` backend, the `torch-cuda` backend and transformers' eager path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMOLLM2 = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True,
)  # fmt: skip
GEMMA3 = dict(
    hidden_size=640, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
    head_dim=256, vocab_size=4096, sliding_window=64, max_position_embeddings=2048,
)  # fmt: skip


def random_model(folder: Path, model_type: str, config: dict) -> Path:
    """A random-weight HF model of `model_type` saved as safetensors (f32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (folder / "config.json").exists():
        cfg = AutoConfig.for_model(model_type, **config)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder, safe_serialization=True)
    return folder


def section_env() -> dict:
    import triton

    from agentkv.hal.registry import lookup

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(0),
        "identity": list(lookup("cuda").identity),
    }


def section_witness(work: Path) -> dict:
    from agentkv.hal.registry import lookup
    from agentkv.witness.model import witness_model
    from agentkv.witness.ops import run_ops

    cuda, ref = lookup("cuda"), lookup("reference")
    rows = [r._asdict() for r in run_ops(cuda, ref)]
    for name, model_type, cfg in (("smollm2-shape", "llama", SMOLLM2), ("gemma3-shape", "gemma3_text", GEMMA3)):
        row = witness_model(str(random_model(work / name, model_type, cfg)), cuda, ref)
        rows.append(row._replace(op=f"model/{name}")._asdict())
    return {"rows": rows, "failed": [r["op"] for r in rows if r["status"] != "PASS"]}


def section_exactness(work: Path) -> dict:
    from agentkv.hal.registry import lookup
    from tests.hal.cuda_interp import invariance
    from tests.hal.cuda_interp_model import model_checks

    cuda = lookup("cuda")
    return {"invariance": invariance(cuda), "model": model_checks(work, cuda, lookup("reference"))}


def section_sync(work: Path) -> dict:
    from agentkv.hal.registry import lookup
    from agentkv.runtime.runner import Chunk
    from agentkv.witness.host_sync import HostReads
    from tests.hal.cuda_interp_model import PROMPT, _runner

    runner = _runner(work, lookup("cuda"))
    table = list(range(2))
    runner.run([Chunk(PROMPT[:4], 0, table, None)])
    ids, meta, rows = runner.build([Chunk(PROMPT[4:5], 4, table, "last")])
    runner.model.forward(ids, meta, runner.kv, rows)  # warm: the kernels compile once
    torch.cuda.synchronize()
    error = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        with HostReads(runner.backend) as reads:
            runner.model.forward(ids, meta, runner.kv, rows)
    except RuntimeError as e:
        error = str(e)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"sync_debug_error": error, "hidden_host_reads": reads.hidden}


def section_moe(work: Path) -> dict:
    """The tiny Qwen3-MoE GGUF (Q8_0 and F16 experts) and the tiny MXFP4 gpt-oss (sinks, a
    window, biased experts) of tests/hal/cuda_interp_moe.py on the device: logits against the
    reference, split- and batch-exact, the decode step's host reads."""
    from agentkv.hal.registry import lookup
    from tests.hal.cuda_interp_moe import gpt_oss, moe_checks, tiny_moe

    cuda, ref = lookup("cuda"), lookup("reference")
    out = {}
    for name, build in (("qwen3moe", tiny_moe), ("gpt-oss", gpt_oss)):
        folder = work / name
        folder.mkdir(exist_ok=True)
        out[name] = _run(lambda build=build, folder=folder: moe_checks(build(folder), cuda, ref, control=False))
    return out


def _bench_agentkv(folder: Path, backend: str, prompt: list[int], steps: int) -> dict:
    from agentkv.formats.resolve import open_model
    from agentkv.hal.registry import lookup
    from agentkv.models.registry import load_model
    from agentkv.runtime.runner import Chunk, ModelRunner

    model = load_model(open_model(folder), lookup(backend))
    bs = 16
    table = list(range(-(-(len(prompt) + steps + 1) // bs)))
    for timed in (False, True):  # the first pass compiles the kernels
        runner = ModelRunner(model, len(table), bs)
        start = time.perf_counter()
        logits = runner.run([Chunk(prompt, 0, table, "last")])
        prefill = time.perf_counter() - start
        token, start = int(logits[0].argmax()), time.perf_counter()
        for i in range(steps if timed else 2):
            token = int(runner.run([Chunk([token], len(prompt) + i, table, "last")])[0].argmax())
        decode = time.perf_counter() - start
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": steps / decode}


def _bench_transformers(folder: Path, prompt: list[int], steps: int) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").cuda()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(ids)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        torch.cuda.synchronize()
        total = time.perf_counter() - start
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": steps / max(total - prefill, 1e-9)}


def section_bench(work: Path) -> dict:
    folder = random_model(work / "smollm2-shape", "llama", SMOLLM2)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 40000, 512)]
    out = {"model": "random SmolLM2-135M shape, f32 weights", "prompt": len(prompt), "decode_steps": 64}
    for name, fn in (
        ("cuda", lambda: _bench_agentkv(folder, "cuda", prompt, 64)),
        ("torch-cuda", lambda: _bench_agentkv(folder, "torch-cuda", prompt, 64)),
        ("transformers-eager", lambda: _bench_transformers(folder, prompt, 64)),
    ):
        out[name] = _run(fn)
    return out


def _run(fn) -> dict:
    start = time.perf_counter()
    try:
        result = fn()
    except Exception:  # a section that fails is reported with its traceback, and the rest still runs
        result = {"error": traceback.format_exc()[-3000:]}
    return {"seconds": round(time.perf_counter() - start, 2), "result": result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args()
    work = args.out / "models"
    work.mkdir(parents=True, exist_ok=True)
    report = {"env": _run(section_env)}
    sections = (("witness", section_witness), ("exactness", section_exactness), ("sync", section_sync))
    for name, fn in (*sections, ("moe", section_moe)):
        report[name] = _run(lambda fn=fn: fn(work))
        print(name, json.dumps(report[name], default=str)[:2000], flush=True)
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))  # kept if cut short
    if not args.skip_bench:
        report["bench"] = _run(lambda: section_bench(work))
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v.get("result", v) for k, v in report.items() if k in ("env", "bench", "sync")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
