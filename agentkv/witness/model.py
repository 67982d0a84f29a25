"""Whole-model witness: one prompt's logits on a backend against the reference backend."""

from __future__ import annotations

import numpy as np

from agentkv.formats.resolve import open_model
from agentkv.hal.base import Backend
from agentkv.models.base import LoadOptions
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from agentkv.witness.ops import COSINE_FLOOR_MODEL, COSINE_FLOOR_QUANT, WitnessRow, compare

# A whole quantized model with int8 activations against the reference's f32 activations: the
# rounding of every matmul input compounds over the layers. 1 - cosine of the logits measured
# 2.0e-4 (SmolLM2) and 8.2e-4 (Gemma-3-270M) on the witness prompt, whose random tokens give
# flat logits: Gemma's argmax moved at some of its 24 positions. So in this mode the argmax is
# counted in the note, not required; tools/kv_dtype_agreement.py measures the quality on text.
COSINE_FLOOR_MODEL_INT8 = 0.998

WITNESS_PROMPT_LEN = 24


def prompt_logits(model, ids: list[int], block_size: int = 16) -> np.ndarray:
    num_blocks = -(-len(ids) // block_size) + 1
    runner = ModelRunner(model, num_blocks, block_size)
    return runner.run([Chunk(ids, 0, list(range(num_blocks)), "all")])


def witness_model(name: str, backend: Backend, reference: Backend, weights: str = "resident") -> WitnessRow:
    """Logits at every position of a fixed token prompt; argmax must match everywhere (with int8
    activations: counted, see COSINE_FLOOR_MODEL_INT8). Each side stores K/V as its own
    `kv_dtype` (the same on both for a fair witness)."""
    source = open_model(name)
    vocab = source.hparams.vocab_size
    ids = [int(x) for x in np.random.default_rng(0).integers(3, min(vocab, 20000), WITNESS_PROMPT_LEN)]
    ref = prompt_logits(load_model(source, reference, LoadOptions("f32")), ids)
    model = load_model(source, backend, LoadOptions(weights))
    quantized = any(q not in (0, 1, 30) for q in model.weight_formats.values())  # f32, f16, bf16: exact
    floor = COSINE_FLOOR_QUANT if quantized else COSINE_FLOOR_MODEL
    int8 = quantized and backend.activation_dtype == "int8"
    got = prompt_logits(model, ids)
    shape = f"{WITNESS_PROMPT_LEN} tokens, weights={weights}"
    row = compare(f"model/{name}", shape, ref, got, COSINE_FLOOR_MODEL_INT8 if int8 else floor, not int8)
    note = "resident quantized weights" if quantized else "f32 weights"
    if int8:
        same = int((ref.argmax(-1) == got.argmax(-1)).sum())
        note += f", int8 activations: argmax equal at {same}/{len(ids)} positions"
    if backend.kv_dtype != "f32" or reference.kv_dtype != "f32":
        note += f", {backend.kv_dtype} KV (reference {reference.kv_dtype})"
    return row._replace(note=note)
