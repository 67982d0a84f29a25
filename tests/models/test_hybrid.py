"""Hybrid families (gated DeltaNet + gated attention): Qwen3-Next (MoE) and the Qwen3.5 text
model against transformers, and the state store's byte layout.

Oracle: HF transformers in float32 (its chunked gated delta rule for a prompt; agentkv runs
the recurrence token by token, so the two round differently and the tolerance covers it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.commands.inspect import summarize
from agentkv.formats.resolve import open_model
from agentkv.hal.recurrent import DeltaNetSpec
from agentkv.hal.state_store import StateStore
from tests.models.helpers import assert_logits_match, hf_logits, our_logits, prompt

# Tiny shapes: 3 DeltaNet layers and one full-attention layer (the 4th), 2 key / 4 value heads.
HYBRID = dict(
    num_hidden_layers=4,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
QWEN3_NEXT = dict(
    HYBRID, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts_per_tok=2, num_experts=4
)
MIN_COS = 0.99999  # the floor; measured 1 - cos < 2e-9 on both families and backends


def tiny_hybrid(folder, model_type: str, seed: int = 0, **overrides):
    """A random HF hybrid saved to `folder`. Gains are randomised: the zero-centred RMSNorms
    (1 + w) around 0, the gated norm's plain gain around 1, so a misplaced norm shows."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.models.helpers import TINY

    shapes = HYBRID if model_type == "qwen3_5_text" else QWEN3_NEXT  # the others are MoE
    config = AutoConfig.for_model(model_type, **{**TINY, **shapes, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def hybrid(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_hybrid(folder, request.param)
    ids = prompt(40)
    return folder, model, ids, hf_logits(model, ids)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_hybrid_matches_transformers(hybrid, backend):
    folder, _, ids, theirs = hybrid
    assert_logits_match(our_logits(folder, backend, ids), theirs, MIN_COS)


def test_inspect_reports_state_and_kv_bytes(hybrid):
    folder, model, _, _ = hybrid
    cfg = model.config
    summary = summarize(open_model(folder))["hparams"]  # what `agentkv inspect` prints
    conv_dim = 2 * 2 * 8 + 4 * 8  # q, k: 2 heads x 8; v: 4 heads x 8
    per_layer = 4 * ((4 - 1) * conv_dim + 4 * 8 * 8)  # f32 conv state + recurrent state
    assert summary["layer_kinds"] == "RRRA"
    assert summary["snapshot_bytes"] == 3 * per_layer
    assert summary["kv_bytes_per_token_f16"] == 2 * 2 * cfg.num_key_value_heads * cfg.head_dim


def check_slot_round_trip(spec) -> None:
    """Two layers of `spec`: a snapshot slot's bytes (`read_slot`) written into another slot
    give it the same states and make it a snapshot; a slot without one reads as zeros with a 0
    flag and writes back as empty; a short payload is refused."""
    store = StateStore([spec, spec], num_slots=4, block_size=4, every=2)
    rng = np.random.default_rng(0)
    for slot in (0, 1):
        for layer in range(2):
            store.conv[layer][slot] = rng.standard_normal(spec.conv_shape).astype(np.float32)
            store.recurrent[layer][slot] = rng.standard_normal(spec.recurrent_shape).astype(np.float32)
        store.snapshots.add(slot)
    data = store.read_slot(1)
    assert len(data) == store.bytes_per_slot + 1 == 2 * spec.state_bytes + 1 and data[-1] == 1
    store.write_slot(2, data)
    assert store.has(2) and store.bytes_held == 3 * store.bytes_per_slot
    for arrays in (store.conv, store.recurrent):
        for a in arrays:
            assert np.array_equal(a[2], a[1]) and not np.array_equal(a[2], a[0])
    assert store.read_slot(3) == bytes(store.bytes_per_slot + 1)
    store.write_slot(2, store.read_slot(3))  # no snapshot: the slot is emptied
    assert not store.has(2) and all(2 not in a for a in (*store.conv, *store.recurrent))
    store.release(1)
    assert not store.has(1) and store.bytes_held == store.bytes_per_slot
    with pytest.raises(ValueError, match="expected"):
        store.write_slot(0, data[:-4])


def test_state_slot_bytes_round_trip():
    check_slot_round_trip(DeltaNetSpec(2, 4, 8, 8, 4, 1e-6))
