"""The agent replay on a hybrid and on a dense model of the same width, in one process:
5 agents x 10 turns over a 2K-token shared prefix (each turn appends the model's own answer
and a tool result). Reports prompt tokens computed, the prefix hit rate and wall time per
model; the models are tiny random ones built here (transformers `from_config`), so the wall
times are a ratio between the two arms of one run, never a speed claim.

    python tools/hybrid_replay.py [--agents 5] [--turns 10] [--prefix 2048] [--block-size 16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from agentkv.bench.workloads import lcg
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.params import SamplingParams

VOCAB = 256
WIDTH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
HYBRID = dict(
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)


def build(folder: Path, model_type: str, **extra) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=8192, **WIDTH, **extra)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[])).save(
        str(folder / "tokenizer.json")
    )
    return str(folder)


def replay(model: str, args: argparse.Namespace) -> dict:
    """Turn-major: every agent's turn t runs before any agent's turn t + 1."""
    cache = CacheConfig(num_blocks=4096, block_size=args.block_size)
    engine = Engine(EngineConfig(model=model, cache=cache))
    prefix = lcg(args.prefix, 5001, VOCAB)
    contexts = [prefix + lcg(32, 5100 + 97 * a, VOCAB) for a in range(args.agents)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    t0, cached = time.perf_counter(), 0
    for turn in range(args.turns):
        for a, context in enumerate(contexts):
            engine.add_request(f"{a}-{turn}", context, params)
            answer: list[int] = []
            while engine.has_unfinished():
                for out in engine.step():
                    answer += out.token_ids
                    cached = cached + out.cached_len if out.finished else cached
            contexts[a] = context + answer + lcg(48, 7000 + 97 * a + turn, VOCAB)
    stats = engine.stats()
    return {
        "prompt_tokens": stats.prompt_tokens,
        "computed_tokens": stats.computed_tokens,
        "cached_tokens": cached,
        "hit_rate": round(cached / stats.prompt_tokens, 4),
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--prefix", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hybrid = build(Path(tmp) / "hybrid", "qwen3_5_text", **HYBRID)
        dense = build(Path(tmp) / "dense", "qwen3", head_dim=16)
        report = {"hybrid qwen35": replay(hybrid, args), "dense qwen3": replay(dense, args)}
    print(json.dumps({"args": vars(args), **report}, indent=1))


if __name__ == "__main__":
    main()
