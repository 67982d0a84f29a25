"""Greedy agreement of an f16 KV cache with the f32 one on a real model:
`python tools/kv_dtype_agreement.py [MODEL ...] [--tokens 64]` (run from the checkout with
`PYTHONPATH` pointing at it). For each prompt it decodes greedily with f32 and with f16 K/V
and prints how many leading tokens agree, the positions that agree, and the largest logit
difference over the agreeing prefix (where both runs saw the same tokens)."""

from __future__ import annotations

import argparse

import numpy as np

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Here is a short story about a robot who learns to paint:\n",
    "Q: What is 17 times 23?\nA:",
    "List three uses of a paper clip:\n1.",
    "The mitochondria is the powerhouse of the cell because",
)


def greedy(model: str, dtype: str, prompts: list[list[int]], max_tokens: int, **knobs):
    """Token ids and sampled logits rows of each prompt, greedy, batched in one engine
    (`knobs`: more engine knobs, e.g. kv_cache_blocks)."""
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams

    engine = Engine(engine_config(model, kv_cache_dtype=dtype, enable_prefix_cache=False, **knobs))
    engine.record_logits = True
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"p{i}", ids, params)
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.token_ids
    return [(outs[f"p{i}"], engine.recorded.pop(f"p{i}")) for i in range(len(prompts))]


def agreement(a: list[int], b: list[int]) -> tuple[int, int]:
    """(leading tokens equal, positions equal)."""
    lead = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return lead, sum(x == y for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3-270m"])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    for model in args.models:
        tok = load_tokenizer(open_model(model))
        prompts = [tok.encode(p) for p in PROMPTS]
        runs = {d: greedy(model, d, prompts, args.tokens) for d in ("f32", "f16")}
        leads, same = [], 0
        for (a, rows_a), (b, rows_b) in zip(runs["f32"], runs["f16"]):
            lead, equal = agreement(a, b)
            leads.append(lead)
            same += equal
            diff = max(
                (float(np.max(np.abs(x - y))) for x, y in zip(rows_a[: lead + 1], rows_b[: lead + 1])), default=0
            )
            print(f"{model}: leading {lead}/{len(a)} agree, {equal}/{len(a)} positions, max |dlogit| {diff:.4f}")
        total = len(PROMPTS) * args.tokens
        print(f"{model}: all {sum(leads)}/{total} leading tokens, {same}/{total} positions, min lead {min(leads)}")


if __name__ == "__main__":
    main()
