"""Greedy and top-1 agreement of a reduced-precision variant with f32 on a real model:
`python tools/kv_dtype_agreement.py [MODEL ...] [--tokens 64] [--knob kv_cache_dtype --value f16]`
(run from the checkout with `PYTHONPATH` pointing at it; `--knob activation_dtype --value int8`
checks the int8-activation matmuls). For each prompt it decodes greedily with f32 and with the
variant and prints how many leading tokens agree, the positions that agree and the largest
logit difference over the agreeing prefix (where both runs saw the same tokens); then, teacher
forced on the f32 run's tokens, the positions where the variant's top-1 token is f32's."""

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


def make_engine(model: str, value: str, knob: str = "kv_cache_dtype", **knobs):
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine

    return Engine(engine_config(model, enable_prefix_cache=False, **{knob: value}, **knobs))


def greedy(model: str, value: str, prompts: list[list[int]], max_tokens: int, knob: str = "kv_cache_dtype", **knobs):
    """Token ids and sampled logits rows of each prompt, greedy, batched in one engine whose
    `knob` is `value` (`knobs`: more engine knobs, e.g. kv_cache_blocks)."""
    from agentkv.runtime.outputs import merge_into
    from agentkv.runtime.params import SamplingParams

    engine = make_engine(model, value, knob, **knobs)
    engine.record_logits = True
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"p{i}", ids, params)
    outs: dict = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
    return [(outs[f"p{i}"].token_ids, engine.recorded.pop(f"p{i}")) for i in range(len(prompts))]


def top1(model: str, value: str, sequences: list[list[int]], knob: str = "kv_cache_dtype") -> list[np.ndarray]:
    """Per sequence, the argmax token at every position of one teacher-forced prefill."""
    from agentkv.runtime.runner import Chunk

    engine = make_engine(model, value, knob)
    out = []
    for ids in sequences:
        blocks = list(range(-(-len(ids) // engine.block_size)))
        out.append(engine.runner.run([Chunk(ids, 0, blocks, "all")]).argmax(-1))
    return out


def agreement(a: list[int], b: list[int]) -> tuple[int, int]:
    """(leading tokens equal, positions equal)."""
    lead = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return lead, sum(x == y for x, y in zip(a, b))


def report(model: str, prompts: list[list[int]], tokens: int, knob: str, value: str) -> None:
    runs = {v: greedy(model, v, prompts, tokens, knob) for v in ("f32", value)}
    leads, same = [], 0
    for (a, rows_a), (b, rows_b) in zip(runs["f32"], runs[value]):
        lead, equal = agreement(a, b)
        leads.append(lead)
        same += equal
        diff = max((float(np.max(np.abs(x - y))) for x, y in zip(rows_a[: lead + 1], rows_b[: lead + 1])), default=0)
        print(f"{model}: leading {lead}/{len(a)} agree, {equal}/{len(a)} positions, max |dlogit| {diff:.4f}")
    total = len(prompts) * tokens
    print(
        f"{model} {knob}={value}: greedy {sum(leads)}/{total} leading tokens, {same}/{total} positions, "
        f"min lead {min(leads)}"
    )
    sequences = [p + ids for p, (ids, _) in zip(prompts, runs["f32"])]
    base, other = top1(model, "f32", sequences, knob), top1(model, value, sequences, knob)
    hits = sum(int((x == y).sum()) for x, y in zip(base, other))
    print(f"{model} {knob}={value}: top-1 {hits}/{sum(len(s) for s in sequences)} positions, teacher forced")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3-270m"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--knob", default="kv_cache_dtype", choices=["kv_cache_dtype", "activation_dtype"])
    parser.add_argument("--value", default=None, help="the variant (default f16 for the KV, int8 for activations)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    value = args.value or {"kv_cache_dtype": "f16", "activation_dtype": "int8"}[args.knob]
    for model in args.models:
        tok = load_tokenizer(open_model(model))
        report(model, [tok.encode(p) for p in PROMPTS], args.tokens, args.knob, value)


if __name__ == "__main__":
    main()
