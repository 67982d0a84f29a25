"""Gemma 3 logits against HF transformers: tiny random `gemma3_text` models (safetensors) with
local/global layers and a prompt longer than the window, and the real Gemma-3-270M Q4_K_M
GGUF against transformers loading the same GGUF."""

from __future__ import annotations

import pytest

from tests.models.helpers import BACKENDS, assert_logits_match, hf_logits, our_logits, prompt, tiny_hf_model

# Same float32 weights on both sides; only summation order differs (see test_llama_family).
MIN_COS = 0.99999
# The real model: transformers dequantizes the Q4_K/Q6_K blocks to float32 with gguf-py, we
# dequantize (reference) or run quantized kernels (torch) — 18 layers of 640-wide rows with a
# 262k vocabulary accumulate more rounding than the tiny model; 1e-4 still catches any wrong op.
MIN_COS_REAL = 0.9999
PROMPT_LEN = 13  # > the tiny window of 4

_LOCAL_GLOBAL = ["sliding_attention", "sliding_attention", "full_attention"]
CASES = {
    "plain": dict(),
    # larger gemma3 configs scale global-layer rope linearly by 8; local layers keep the default
    "rope-linear": dict(
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
    ),
    # attn_logit_softcapping is set to show it is ignored, as transformers' Gemma 3 ignores it
    "softcap": dict(final_logit_softcapping=3.0, attn_logit_softcapping=5.0),
}
_BUILT: dict[str, tuple] = {}


def built(name: str, tmp_path_factory) -> tuple:
    """(folder, hf model, hf logits, prompt) for one tiny gemma3 case, built once per session."""
    if name not in _BUILT:
        folder = tmp_path_factory.mktemp(f"gemma3-{name}")
        model = tiny_hf_model(
            folder,
            "gemma3_text",
            norm_offset=0.0,
            num_hidden_layers=3,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=_LOCAL_GLOBAL,
            **CASES[name],
        )
        ids = prompt(PROMPT_LEN)
        _BUILT[name] = folder, model, hf_logits(model, ids), ids
    return _BUILT[name]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_matches_transformers(name, backend, tmp_path_factory):
    folder, _, expected, ids = built(name, tmp_path_factory)
    assert_logits_match(our_logits(folder, backend, ids), expected, MIN_COS)


def test_window_and_rope_scaling_matter(tmp_path_factory):
    """Controls: the 4-token window and the global-layer rope scaling each change the logits,
    so the tiny cases above exercise them."""
    from transformers import AutoModelForCausalLM

    folder, _, plain, ids = built("plain", tmp_path_factory)
    _, _, scaled, _ = built("rope-linear", tmp_path_factory)
    assert abs(plain[-1] - scaled[-1]).max() > 1e-3
    full = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", sliding_window=PROMPT_LEN + 1
    ).eval()
    assert abs(hf_logits(full, ids)[-1] - plain[-1]).max() > 1e-3


# "<bos>The capital of France is" in Gemma 3's vocabulary; ids keep the test tokenizer-free.
REAL_PROMPT = [2, 818, 5279, 529, 7001, 563]


@pytest.fixture(scope="module")
def real_expected(gemma3_path) -> tuple:
    """transformers' logits for the real GGUF (it dequantizes every tensor to float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        gemma3_path.parent, gguf_file=gemma3_path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return hf_logits(model, REAL_PROMPT)[-1:]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_real_gguf_matches_transformers(gemma3_path, real_expected, backend):
    ours = our_logits(gemma3_path, backend, REAL_PROMPT, block_size=16, rows="last")
    assert_logits_match(ours, real_expected, MIN_COS_REAL)
