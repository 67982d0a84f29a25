"""`agentkv bench lora`: what serving LoRA adapters costs. One batch of ROWS sequences on one
base model: every row on the base, against every row on its own adapter (8 adapters mixed in
one step by default), timed at the model runner (the engine's scheduling is the same for both).

- prefill: ROWS prompts of PROMPT_LEN tokens in one step, tokens/s (best of REPEATS);
- decode: ROWS rows of one token each after their prompts, tokens/s (median step of STEPS);
- the overhead as a ratio, base / adapters (target: decode <= 1.3x).

Adapters are random (A and B ~ N(0, 0.02)), rank RANK on every projection (q, k, v, o, gate,
up, down), written as PEFT folders under the bench cache and loaded through the same reader
and attach path the server uses.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from agentkv.bench.common import bar_plot, cache_dir, envelope, log, print_paths, table, write_outputs

TARGET_DECODE = 1.3
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
PROJECTIONS |= {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--adapters", type=int, default=8, help="distinct adapters mixed in the batch (default 8)")
    parser.add_argument("--rows", type=int, default=8, help="sequences in the batch (default 8)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--targets", default=",".join(PROJECTIONS), help="comma list of PEFT modules (default: all seven)"
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed (default 32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/out")


def shapes(hp) -> dict[str, tuple[int, int]]:
    """PEFT module -> (out, in) of the base projection."""
    q, kv = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim
    d, f = hp.hidden_size, hp.intermediate_size
    return {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q)} | {
        "gate_proj": (f, d),
        "up_proj": (f, d),
        "down_proj": (d, f),
    }


def write_random_adapter(folder: Path, hp, rank: int, seed: int, targets=tuple(PROJECTIONS)) -> Path:
    """A PEFT LoRA folder with random A and B for the `targets` projections of every layer."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(hp.num_layers):
        for module, (out, inp) in shapes(hp).items():
            if module not in targets:
                continue
            stem = f"base_model.model.model.layers.{layer}.{PROJECTIONS[module]}.{module}"
            tensors[f"{stem}.lora_A.weight"] = rng.normal(0, 0.02, (rank, inp)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.normal(0, 0.02, (out, rank)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(targets)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def measure(runner, arms: dict[str, list], prompt_len: int, steps: int, repeats: int) -> dict[str, dict]:
    """Prefill and decode tokens/s of one batch per arm, whose row i uses arm[i] (None: the
    base). The arms alternate run by run and step by step (each in its own KV blocks), so a
    drift in the machine's load falls on both alike; one untimed prefill each warms up."""
    from agentkv.runtime.runner import Chunk

    rows = len(next(iter(arms.values())))
    per_seq = math.ceil((prompt_len + steps + 1) / runner.block_size)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, runner.model.vocab_size, prompt_len).tolist() for _ in range(rows)]
    tables, prefill, step_s, ids = {}, {}, {}, {}
    for k, arm in enumerate(arms):
        first = k * rows * per_seq
        tables[arm] = [list(range(first + i * per_seq, first + (i + 1) * per_seq)) for i in range(rows)]
        prefill[arm], step_s[arm] = [], []
    for r in range(repeats + 1):
        for arm, adapters in arms.items():
            t0 = time.perf_counter()
            logits = runner.run([Chunk(p, 0, t, "last", a) for p, t, a in zip(prompts, tables[arm], adapters)])
            if r:
                prefill[arm].append(time.perf_counter() - t0)
            ids[arm] = logits.argmax(-1).tolist()
    for s in range(steps):
        for arm, adapters in arms.items():
            t0 = time.perf_counter()
            chunks = [Chunk([tok], prompt_len + s, t, "last", a) for tok, t, a in zip(ids[arm], tables[arm], adapters)]
            ids[arm] = runner.run(chunks).argmax(-1).tolist()
            step_s[arm].append(time.perf_counter() - t0)
    return {
        arm: {
            "prefill_tok_s": rows * prompt_len / min(prefill[arm]),
            "decode_tok_s": rows / statistics.median(step_s[arm]),
        }
        for arm in arms
    }


def make_arms(model, args: argparse.Namespace) -> dict[str, list]:
    """Row i's adapter per arm: the base, and the adapters in each dtype the backend reads."""
    from agentkv.formats.lora import read_peft_adapter
    from agentkv.runtime.adapters import attach

    targets = tuple(t for t in args.targets.split(",") if t)
    for bad in [t for t in targets if t not in PROJECTIONS]:
        raise ValueError(f"--targets: unknown module {bad!r}; choose from {', '.join(PROJECTIONS)}")
    log(f"{args.adapters} random rank-{args.rank} adapters on {args.model} ({', '.join(targets)}) ...")
    root = cache_dir() / "lora" / f"{Path(str(args.model)).name}-r{args.rank}-{'-'.join(sorted(targets))}"
    files = [
        read_peft_adapter(write_random_adapter(root / f"a{i}", model.hparams, args.rank, i, targets))
        for i in range(args.adapters)
    ]
    arms: dict[str, list] = {"base": [None] * args.rows}
    for dtype in getattr(model.backend, "lora_dtypes", ("f32",)):
        adapters = [attach(model, f, f"a{i}", dtype=dtype) for i, f in enumerate(files)]
        arms[f"lora-{dtype}"] = [adapters[i % len(adapters)] for i in range(args.rows)]
    return arms


def run(args: argparse.Namespace) -> int:
    from agentkv.formats.resolve import open_model
    from agentkv.hal.registry import lookup
    from agentkv.models.registry import load_model
    from agentkv.runtime.runner import ModelRunner

    if args.adapters < 1 or args.rows < args.adapters:
        raise ValueError(f"--adapters={args.adapters} must be in 1..--rows={args.rows}")
    model = load_model(open_model(args.model), lookup("cpu"))
    arms = make_arms(model, args)
    per_seq = math.ceil((args.prompt_len + args.steps + 1) / 16)
    runner = ModelRunner(model, len(arms) * args.rows * per_seq, 16)
    log(
        f"{args.rows} rows, prompt {args.prompt_len}, {args.steps} decode steps, arms {', '.join(arms)} alternating ..."
    )
    results = measure(runner, arms, args.prompt_len, args.steps, args.repeats)
    overhead = {
        arm: {k: results["base"][k] / r[k] for k in ("prefill_tok_s", "decode_tok_s")}
        for arm, r in results.items()
        if arm != "base"
    }
    best = min(o["decode_tok_s"] for o in overhead.values())
    payload = envelope(
        "lora",
        model=args.model,
        backend="cpu",
        rows=args.rows,
        adapters=args.adapters,
        rank=args.rank,
        target_modules=args.targets,
        prompt_len=args.prompt_len,
        steps=args.steps,
        repeats=args.repeats,
        results=results,
        overhead=overhead,
        targets={"decode_overhead_max": TARGET_DECODE},
        decode_verdict="met" if best <= TARGET_DECODE else "missed",
    )
    md = table(
        ["arm", "prefill tok/s", "decode tok/s"],
        [[a, r["prefill_tok_s"], r["decode_tok_s"]] for a, r in results.items()],
    )
    md.append("")
    for arm, o in overhead.items():
        md.append(
            f"- overhead, base ÷ {arm} ({args.adapters} adapters mixed): prefill ×{o['prefill_tok_s']:.2f}, "
            f"decode ×{o['decode_tok_s']:.2f}"
        )
    md.append(f"- target decode ≤ {TARGET_DECODE}×: {payload['decode_verdict']} (best arm ×{best:.2f})")
    out = Path(args.out)
    groups = {k: {a: r[k] for a, r in results.items()} for k in ("prefill_tok_s", "decode_tok_s")}
    title = f"{args.model}: {args.rows} rows, base vs {args.adapters} rank-{args.rank} adapters ({args.targets}) mixed"
    stem = f"lora-r{args.rank}-{len(args.targets.split(','))}proj"
    png = bar_plot(out / f"{stem}.png", title, groups, "tok/s")
    if png:
        md.append(f"\n![lora]({png.name})")
    paths = write_outputs(out, stem, payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0
