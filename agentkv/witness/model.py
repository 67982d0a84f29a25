"""Whole-model witness: one prompt's logits on a backend against the reference backend."""

from __future__ import annotations

import numpy as np

from agentkv.formats.resolve import open_model
from agentkv.hal.base import Backend
from agentkv.models.base import LoadOptions
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from agentkv.witness.ops import COSINE_FLOOR_MODEL, COSINE_FLOOR_QUANT, WitnessRow, compare

WITNESS_PROMPT_LEN = 24


def prompt_logits(model, ids: list[int], block_size: int = 16) -> np.ndarray:
    num_blocks = -(-len(ids) // block_size) + 1
    runner = ModelRunner(model, num_blocks, block_size)
    return runner.run([Chunk(ids, 0, list(range(num_blocks)), "all")])


def witness_model(name: str, backend: Backend, reference: Backend, weights: str = "resident") -> WitnessRow:
    """Logits at every position of a fixed token prompt; argmax must match everywhere. Each
    side stores K/V as its own `kv_dtype` (the same on both for a fair witness)."""
    source = open_model(name)
    vocab = source.hparams.vocab_size
    ids = [int(x) for x in np.random.default_rng(0).integers(3, min(vocab, 20000), WITNESS_PROMPT_LEN)]
    ref = prompt_logits(load_model(source, reference, LoadOptions("f32")), ids)
    model = load_model(source, backend, LoadOptions(weights))
    quantized = any(q not in (0, 1, 30) for q in model.weight_formats.values())  # f32, f16, bf16: exact
    floor = COSINE_FLOOR_QUANT if quantized else COSINE_FLOOR_MODEL
    got = prompt_logits(model, ids)
    row = compare(f"model/{name}", f"{WITNESS_PROMPT_LEN} tokens, weights={weights}", ref, got, floor, True)
    note = "resident quantized weights" if quantized else "f32 weights"
    if backend.kv_dtype != "f32" or reference.kv_dtype != "f32":
        note += f", {backend.kv_dtype} KV (reference {reference.kv_dtype})"
    return row._replace(note=note)
