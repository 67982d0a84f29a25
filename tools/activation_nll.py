"""Teacher-forced perplexity of a text under f32 and int8 activations (or any two values of an
engine knob): `python tools/activation_nll.py [MODEL ...] [--text FILE] [--window 512]
[--windows 4]` (from the checkout, `PYTHONPATH` at it). The text (by default Debian's
GPL-3 licence text, present on every Debian machine) is cut into windows of `--window`
tokens; each window is one prefill whose logits score its next tokens. Prints per model and
value the mean negative log-likelihood per token, its perplexity and how many positions' top-1
agree with f32's: the figure that says whether int8's rounding costs the model anything beyond
which of two near-tied tokens greedy decoding picks."""

from __future__ import annotations

import argparse

import numpy as np

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


def windows(ids: list[int], size: int, count: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, size * count, size) if len(ids[i : i + size]) == size]


def score(model: str, value: str, knob: str, seqs: list[list[int]]) -> tuple[float, list[np.ndarray]]:
    """Mean NLL per predicted token over `seqs`, and each sequence's argmax row."""
    from agentkv.runtime.config import engine_config
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.runner import Chunk

    engine = Engine(engine_config(model, enable_prefix_cache=False, **{knob: value}))
    total, count, tops = 0.0, 0, []
    for ids in seqs:
        blocks = list(range(-(-len(ids) // engine.block_size)))
        logits = engine.runner.run([Chunk(ids, 0, blocks, "all")]).astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
        tops.append(logits.argmax(-1))
    return total / count, tops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3-270m"])
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--knob", default="activation_dtype", choices=["activation_dtype", "kv_cache_dtype"])
    parser.add_argument("--values", nargs="+", default=["f32", "int8"])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    text = open(args.text, encoding="utf-8").read()
    for model in args.models:
        seqs = windows(load_tokenizer(open_model(model)).encode(text), args.window, args.windows)
        base = None
        for value in args.values:
            nll, tops = score(model, value, args.knob, seqs)
            base = tops if base is None else base
            agree = sum(int((a == b).sum()) for a, b in zip(base, tops))
            print(
                f"{model} {args.knob}={value}: {len(seqs)} x {args.window} tokens, NLL {nll:.5f}/token, "
                f"perplexity {np.exp(nll):.4f}, top-1 as {args.values[0]} {agree}/{sum(map(len, tops))}",
                flush=True,
            )


if __name__ == "__main__":
    main()
