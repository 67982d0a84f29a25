"""Flags shared by the commands that load a model and sample from it."""
from __future__ import annotations

import argparse

from agentkv.runtime.params import SamplingParams


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="alias (smollm2, gemma3-270m, minilm), a .gguf file or a HF folder")
    p.add_argument("--backend", default="cpu", help="compute backend (cpu, torch, torch-cuda, reference)")
    p.add_argument("--weights", choices=["resident", "f32"], default="resident",
                   help="keep quantized weights quantized (resident) or dequantize at load (f32)")
    p.add_argument("--max-model-len", type=int, default=None)


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--logprobs", type=int, default=None, help="top logprobs per token")


def sampling_params(args) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, stop=tuple(args.stop), logprobs=args.logprobs)
