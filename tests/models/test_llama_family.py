"""Llama-family logits (llama, mistral, qwen2, qwen3) against HF transformers, from tiny random
models saved as safetensors and, for llama and qwen2, the same weights written as a GGUF.

Tolerance: cosine >= 0.99999 per position and equal argmax. Both sides compute in float32 with
the same weights; what differs is summation order (our row-wise GEMV and per-row softmax vs
torch's batched GEMM), worth ~1e-7 relative per op — far below 1e-5 after a few layers of a
64-wide model, while any wrong op (norm, rope layout, window, bias) drops the cosine to ~0.9."""

from __future__ import annotations

import pytest

from tests.models.helpers import BACKENDS, assert_logits_match, hf_logits, our_logits, prompt, tiny_hf_model, write_gguf

MIN_COS = 0.99999
PROMPT_LEN = 13  # > 3 blocks of 4, > mistral's window of 4

FAMILIES = {
    "llama": dict(model_type="llama"),
    "llama3-rope": dict(
        model_type="llama",
        num_hidden_layers=2,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "mistral": dict(model_type="mistral", sliding_window=4, num_hidden_layers=3),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=16),
}


_BUILT: dict[str, tuple] = {}


def built(name: str, tmp_path_factory) -> tuple:
    """(folder, hf model, hf logits, prompt) for one tiny family model, built once per session."""
    if name not in _BUILT:
        spec = dict(FAMILIES[name])
        folder = tmp_path_factory.mktemp(name)
        model = tiny_hf_model(folder, spec.pop("model_type"), **spec)
        ids = prompt(PROMPT_LEN)
        _BUILT[name] = folder, model, hf_logits(model, ids), ids
    return _BUILT[name]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_safetensors_matches_transformers(name, backend, tmp_path_factory):
    folder, _, expected, ids = built(name, tmp_path_factory)
    assert_logits_match(our_logits(folder, backend, ids), expected, MIN_COS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_gguf_matches_transformers(name, backend, tmp_path_factory, tmp_path):
    """llama.cpp permutes llama q/k rows (interleaved rope) and keeps qwen2's halves layout."""
    _, model, expected, ids = built(name, tmp_path_factory)
    path = write_gguf(model, tmp_path / f"{name}.gguf", name)
    assert_logits_match(our_logits(path, backend, ids), expected, MIN_COS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gguf_llama3_rope_freqs_matches_transformers(backend, tmp_path_factory, tmp_path):
    """Llama 3.x GGUFs carry rope scaling as a `rope_freqs.weight` tensor of divisors."""
    _, model, expected, ids = built("llama3-rope", tmp_path_factory)
    path = write_gguf(model, tmp_path / "llama3.gguf", "llama")
    assert_logits_match(our_logits(path, backend, ids), expected, MIN_COS)


def test_sliding_window_changes_logits(tmp_path_factory):
    """Control: mistral's window of 4 really cuts the 13-token context — the same weights
    without a window give different logits at the prompt end."""
    from transformers import AutoModelForCausalLM

    folder, _, expected, ids = built("mistral", tmp_path_factory)
    full = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", sliding_window=None).eval()
    assert abs(hf_logits(full, ids)[-1] - expected[-1]).max() > 1e-3


def test_llama3_scaling_changes_logits(tmp_path_factory):
    """Control: the llama3 rope-scaling case differs from plain rope with the same weights."""
    _, _, plain, _ = built("llama", tmp_path_factory)
    _, _, scaled, _ = built("llama3-rope", tmp_path_factory)
    assert abs(plain[-1] - scaled[-1]).max() > 1e-3
