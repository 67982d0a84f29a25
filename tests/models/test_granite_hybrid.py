"""Granite-4.0-H (Mamba-2 + attention hybrid) against transformers, what `agentkv inspect`
reports for it, and the Mamba-2 state's slot layout.

Oracle: HF transformers in float32 (its chunked SSD scan for a prompt; agentkv runs the
recurrence token by token, so the two round differently and the tolerance covers it)."""

from __future__ import annotations

import shutil

import pytest
import torch

from agentkv.commands.inspect import summarize
from agentkv.formats.errors import SafetensorsError
from agentkv.formats.resolve import open_model
from agentkv.hal.mamba import Mamba2Spec
from agentkv.models.granite_hybrid import GraniteHybridConfig
from tests.models.helpers import TINY, assert_logits_match, hf_logits, our_logits, prompt
from tests.models.test_hybrid import check_slot_round_trip

# 3 Mamba-2 layers around one attention layer; 8 heads of 16 in 2 groups of B/C (state 16).
GRANITE = dict(
    num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "mamba"],
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    shared_intermediate_size=48,
    # Granite-4.0-H's multipliers are of these sizes; each one off shows in the logits
    embedding_multiplier=12.0,
    attention_multiplier=0.25,
    residual_multiplier=0.22,
    logits_scaling=6.0,
)
# Granite-4.0-H-Micro: no experts, the shared MLP as wide as intermediate_size (llama.cpp
# requires that of a dense granitehybrid GGUF)
DENSE = dict(num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=128)
VARIANTS = {
    "moe-nope": {},  # Granite-4.0-H-Tiny/Small: MoE + shared expert, attention without rope
    "dense-rope": dict(DENSE, position_embedding_type="rope"),  # the shared MLP alone, rotated attention
    "moe-biases": dict(mamba_proj_bias=True, mamba_conv_bias=False),  # in/out_proj biases, conv without
}
MIN_COS = 0.99999  # the floor; measured 1 - cos < 3e-13 on both variants and backends


def tiny_granite(folder, seed: int = 0, **overrides):
    """A random HF Granite-4.0-H saved to `folder`. Every small parameter is randomised (HF
    initialises norms, D and dt_bias to constants, which would hide a misplaced one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("granitemoehybrid", **{**TINY, **GRANITE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(("dt_bias", "conv1d.bias", "A_log")):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(".D"):
                p.copy_(torch.randn_like(p))
            elif name.endswith(".bias"):  # HF starts the projections' biases at zero
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def granite(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_granite(folder, **VARIANTS[request.param])
    ids = prompt(40)
    return folder, model, ids, hf_logits(model, ids)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_granite_hybrid_matches_transformers(granite, backend):
    folder, _, ids, theirs = granite
    assert_logits_match(our_logits(folder, backend, ids), theirs, MIN_COS)


def test_control_a_dropped_multiplier_is_caught(granite, tmp_path):
    """The same weights with the residual multiplier read as 1 leave the oracle's logits: the
    comparison can fail."""
    folder, _, ids, theirs = granite
    shutil.copytree(folder, tmp_path / "m")
    config = tmp_path / "m" / "config.json"
    config.write_text(config.read_text().replace('"residual_multiplier": 0.22', '"residual_multiplier": 1.0'))
    with pytest.raises(AssertionError):
        assert_logits_match(our_logits(tmp_path / "m", "reference", ids), theirs, MIN_COS)


def test_inspect_reports_state_and_kv_bytes(granite):
    folder, model, _, _ = granite
    cfg = model.config
    summary = summarize(open_model(folder))["hparams"]  # what `agentkv inspect` prints
    conv_dim = 8 * 16 + 2 * 2 * 16  # x: 8 heads x 16; B, C: 2 groups x 16
    per_layer = 4 * ((4 - 1) * conv_dim + 8 * 16 * 16)  # f32 conv state + SSM state
    assert summary["layer_kinds"] == "RARR"
    assert summary["snapshot_bytes"] == 3 * per_layer == 3 * 4 * (3 * 192 + 2048)
    assert summary["kv_bytes_per_token_f16"] == 2 * 2 * cfg.num_key_value_heads * (64 // 4)
    assert summary["expert_count"] == cfg.num_local_experts


def test_bad_mamba_shape_names_the_key(tmp_path):
    tiny_granite(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"mamba_d_state": 16', '"mamba_d_state": 0'))
    with pytest.raises(SafetensorsError, match="mamba_d_state is 0"):
        GraniteHybridConfig.from_source(open_model(tmp_path))


def test_mamba_state_slot_bytes_round_trip():
    spec = Mamba2Spec(num_heads=4, head_dim=8, num_groups=2, state_size=4, conv_kernel=4, eps=1e-6)
    assert spec.conv_shape == (3, 4 * 8 + 2 * 2 * 4) and spec.recurrent_shape == (4, 8, 4)
    check_slot_round_trip(spec)
    with pytest.raises(ValueError, match="num_groups"):
        Mamba2Spec(num_heads=3, head_dim=8, num_groups=2, state_size=4, conv_kernel=4, eps=1e-6)
