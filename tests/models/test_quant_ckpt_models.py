"""Whole quantized checkpoints of a tiny llama, read by SafetensorsSource and run by agentkv,
against transformers running the same weights dequantized (cosine >= 0.9999, argmax equal).

Both sides hold identical float32 weights (the dequantization is exact, tests/formats), so the
floor only absorbs the two engines' summation orders, as for plain safetensors models."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.bench.quant_ckpt import w4a16_parts
from agentkv.formats.quants.group32 import AgentQuantType
from agentkv.formats.safetensors import SafetensorsSource
from tests.formats import quant_ckpt_writer as qw
from tests.models.helpers import BACKENDS, assert_logits_match, hf_logits, our_logits, prompt, tiny_hf_model

MIN_COS = 0.9999
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False}


def _ct(fmt: str, weights: dict) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }


def _bf16_scaled_w4a16(w: np.ndarray) -> tuple[dict, np.ndarray]:
    """W4A16 with bf16 scales, as llm-compressor writes a bf16 model's, by the bench's writer."""
    import torch

    parts, values = w4a16_parts(w, 32, "bfloat16")
    to_torch = {"BF16": lambda v: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16)}
    return {k: to_torch.get(dt, torch.from_numpy)(np.ascontiguousarray(v)) for k, (dt, v) in parts.items()}, values


CASES = {
    "gptq-sym-g32": (GPTQ, lambda n, w, r: qw.gptq_parts(w, 4, 32, True, False, False, r)),
    "gptq-v2-asym-8bit": (
        {**GPTQ, "bits": 8, "sym": False, "checkpoint_format": "gptq_v2"},
        lambda n, w, r: qw.gptq_parts(w, 8, 32, False, True, False, r),
    ),
    "gptq-desc-act": (
        {**GPTQ, "sym": False, "desc_act": True},
        lambda n, w, r: qw.gptq_parts(w, 4, 32, False, False, True, r),
    ),
    "awq-g32": (
        {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
        lambda n, w, r: qw.awq_parts(w, 32, r),
    ),
    "ct-w4a16-asym": (
        _ct(
            "pack-quantized", {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}
        ),
        lambda n, w, r: qw.compressed_int_parts(w, 4, 32, False, False, r),
    ),
    "ct-w4a16-bf16-scales": (
        _ct("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}),
        lambda n, w, r: _bf16_scaled_w4a16(w),
    ),
    "ct-w8a16-channel": (
        _ct("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}),
        lambda n, w, r: qw.compressed_int_parts(w, 8, None, True, False, r),
    ),
    "ct-fp8-channel": (
        _ct("float-quantized", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}),
        lambda n, w, r: qw.fp8_parts(w, "channel"),
    ),
    "hf-fp8-block": (
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32]},
        lambda n, w, r: qw.fp8_parts(w, "block", (32, 32), "weight_scale_inv"),
    ),
}


def write_case(folder, case: str):
    """A quantized tiny llama in `folder`; returns transformers' model on its dequantized weights."""
    model = tiny_hf_model(folder / "plain", "llama")
    config, make = CASES[case]
    rng = np.random.default_rng(0)
    dequantized = qw.write_checkpoint(folder / case, model, config, lambda n, w: make(n, w, rng))
    model.load_state_dict(dequantized, strict=False)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_checkpoint_logits_match_transformers(tmp_path, case) -> None:
    model = write_case(tmp_path, case)
    ids = prompt(12)
    theirs = hf_logits(model, ids)
    for backend in BACKENDS:
        assert_logits_match(our_logits(tmp_path / case, backend, ids), theirs, MIN_COS)


def test_resident_formats_and_fallbacks_are_reported(tmp_path) -> None:
    write_case(tmp_path, "gptq-desc-act")
    source = SafetensorsSource(tmp_path / "gptq-desc-act")
    assert source.checkpoint_format("blk.0.attn_q.weight") == "gptq int4 g32 asym act-order"
    assert source.fallback_reason("blk.0.attn_q.weight") == "groups do not fall on whole 32-column blocks"
    assert source.tensor("blk.0.attn_q.weight").qtype == 0
    assert source.checkpoint_format("token_embd.weight") is None
    write_case(tmp_path, "ct-w4a16-asym")
    source = SafetensorsSource(tmp_path / "ct-w4a16-asym")
    assert source.tensor("blk.1.ffn_down.weight").qtype == AgentQuantType.I4G32
    assert source.fallback_reason("blk.1.ffn_down.weight") is None
    write_case(tmp_path, "ct-w4a16-bf16-scales")  # bf16 scales are f16-exact: Q4_0, read as values
    source = SafetensorsSource(tmp_path / "ct-w4a16-bf16-scales")
    assert source.tensor("blk.1.ffn_down.weight").qtype == 2
