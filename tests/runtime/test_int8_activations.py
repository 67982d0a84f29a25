"""The int8-activation matmuls in the engine: the knob reaches the kernels, and the exactness
contract holds in that mode (a cache hit, a batch or a chunk never changes a logit bit).

The tiny model is a Q4_1 GGUF (the int8 kernels serve quantized GGUF weights; f32 weights keep
f32 activations), written from a random HF model with a byte-level vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.registry import lookup
from agentkv.runtime.config import EngineConfig
from agentkv.runtime.engine import Engine
from tests.models.helpers import tiny_hf_model, write_gguf
from tests.runtime.test_exactness import check_contract, make_engine, run, tokens


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("q4")
    model = tiny_hf_model(folder / "hf", "qwen2", seed=3, vocab_size=257, max_position_embeddings=512)
    return str(write_gguf(model, folder / "tiny-q4_1.gguf", "qwen2", qtype="Q4_1", byte_vocab=True))


def test_the_knob_reaches_the_backend_and_changes_the_logits(q4_gguf):
    """Control: int8 logits are not the f32 ones (the mode is real), yet a rerun repeats them."""
    prompt = tokens(40, 1, 257)
    f32 = run(make_engine(q4_gguf), {"p": prompt})[0]["p"]
    engine = make_engine(q4_gguf, activation_dtype="int8")
    assert engine.backend.activation_dtype == "int8"
    int8 = run(engine, {"p": prompt})[0]["p"]
    again = run(make_engine(q4_gguf, activation_dtype="int8"), {"p": prompt})[0]["p"]
    assert not all(np.array_equal(a, b) for a, b in zip(f32, int8))
    assert all(np.array_equal(a, b) for a, b in zip(int8, again))
    # close to the f32 run all the same: the rounding is per 32-wide block
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(f32, int8)]
    assert min(cos) > 0.99


def test_exact_reuse_tiny_q4_1_int8(q4_gguf):
    # 300 tokens: rows past one 256-key attention range; chunks of 1, 7 and 64 rows
    assert check_contract(q4_gguf, "cpu", 257, 300, seed=4, activation_dtype="int8") == []


@pytest.mark.slow
def test_exact_reuse_smollm2_int8():
    assert check_contract("smollm2", "cpu", 49152, 40, seed=3, activation_dtype="int8") == []


def test_the_fingerprint_tells_the_modes_apart():
    """Cached KV (the disk tier) is keyed by the fingerprint: int8 blocks never load into f32."""
    assert lookup("cpu").fingerprint != lookup("cpu").set_activation_dtype("int8").fingerprint


def test_bad_activation_dtypes_are_refused_with_their_name():
    with pytest.raises(ValueError, match="activation_dtype='int4'"):
        EngineConfig(model="smollm2", activation_dtype="int4")
    with pytest.raises(ValueError, match="backend 'reference' has no int8 matmul kernels"):
        lookup("reference").set_activation_dtype("int8")
    with pytest.raises(ValueError, match="has no int8"):
        Engine(EngineConfig(model="smollm2", backend="reference", activation_dtype="int8"))
