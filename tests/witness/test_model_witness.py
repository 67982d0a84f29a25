"""Whole-model witnesses: the cpu backend with resident quantized weights against the
reference backend (f32-dequantized), on the real packaged models."""

from __future__ import annotations

import pytest

from agentkv.hal.registry import lookup
from agentkv.witness.model import COSINE_FLOOR_MODEL_INT8, witness_model
from agentkv.witness.ops import COSINE_FLOOR_QUANT


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m"])
def test_resident_model_witness_passes(model):
    row = witness_model(model, lookup("cpu"), lookup("reference"), weights="resident")
    assert row.status == "PASS", row
    assert row.argmax_match and row.cosine >= COSINE_FLOOR_QUANT
    assert row.note == "resident quantized weights"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m"])
def test_resident_model_witness_passes_with_f16_kv(model):
    row = witness_model(model, lookup("cpu").set_kv_dtype("f16"), lookup("reference").set_kv_dtype("f16"))
    assert row.status == "PASS", row
    assert row.argmax_match and row.cosine >= COSINE_FLOOR_QUANT
    assert row.note == "resident quantized weights, f16 KV (reference f16)"


@pytest.mark.slow
def test_resident_model_witness_with_int8_activations_has_its_own_floor():
    """SmolLM2 with int8 activations: below the f32-activation floor's precision but above its
    own, and the argmax count is reported instead of required (Gemma-3 moves at 2 of 24)."""
    cpu = lookup("cpu")
    row = witness_model("smollm2", cpu.set_activation_dtype("int8"), lookup("reference"))
    assert row.status == "PASS", row
    assert COSINE_FLOOR_MODEL_INT8 <= row.cosine < COSINE_FLOOR_QUANT
    assert row.note.startswith("resident quantized weights, int8 activations: argmax equal at ")
