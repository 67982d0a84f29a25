"""Mixture-of-experts logits (qwen2moe, qwen3moe, mixtral, olmoe) against HF transformers, from
tiny random models saved as safetensors by transformers itself.

Tolerance: cosine >= 0.99999 per position and equal argmax, as for the dense families (float32
on both sides; only summation order differs). That holds only while every token picks the same
experts on both sides, so the tests first assert a top-k margin: at every layer and position the
k-th router probability beats the (k+1)-th by more than ROUTER_MARGIN, a gap ~1e4 times wider
than float32 rounding can move a probability here. A wrong routing rule (renormalisation, shared
expert gate, softmax order) moves the logits far past the floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.helpers import (
    BACKENDS,
    assert_logits_match,
    hf_logits,
    our_logits,
    prompt,
    tiny_hf_model,
)

MIN_COS = 0.99999
ROUTER_MARGIN = 1e-3
PROMPT_LEN = 13
MOE = dict(head_dim=16, num_experts_per_tok=2)

FAMILIES = {
    "qwen2moe": dict(
        model_type="qwen2_moe",
        num_experts=8,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=96,
        norm_topk_prob=False,
    ),
    "qwen3moe": dict(model_type="qwen3_moe", num_experts=8, moe_intermediate_size=32, norm_topk_prob=True),
    "mixtral": dict(model_type="mixtral", num_local_experts=8, intermediate_size=64),
    "olmoe": dict(model_type="olmoe", num_experts=8, intermediate_size=32, norm_topk_prob=False),
}
SEEDS = {"qwen2moe": 0, "qwen3moe": 1, "mixtral": 5, "olmoe": 0}  # seeds whose routers clear the margin

_BUILT: dict[str, tuple] = {}


def router_margin(model, ids: list[int]) -> float:
    """The smallest gap, over layers and positions, between the k-th and (k+1)-th router
    probability HF computes (softmax of `mlp.gate`'s logits on its input)."""
    gaps, hooks = [], []
    k = model.config.num_experts_per_tok

    def hook(module, args, _out):
        logits = args[0].reshape(-1, args[0].shape[-1]) @ module.weight.T
        probs = torch.softmax(logits.double(), dim=-1).sort(dim=-1, descending=True).values
        gaps.append(float((probs[:, k - 1] - probs[:, k]).min()))

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and gate.weight.shape[0] > k:
            hooks.append(gate.register_forward_hook(hook))
    hf_logits(model, ids)
    for h in hooks:
        h.remove()
    return min(gaps)


def built(name: str, tmp_path_factory) -> tuple:
    """(folder, hf model, hf logits, prompt) for one tiny MoE model, built once per session."""
    if name not in _BUILT:
        spec = {**MOE, **FAMILIES[name]}
        folder = tmp_path_factory.mktemp(name)
        model = tiny_hf_model(folder, spec.pop("model_type"), seed=SEEDS[name], **spec)
        ids = prompt(PROMPT_LEN)
        _BUILT[name] = folder, model, hf_logits(model, ids), ids
    return _BUILT[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_router_decisions_are_not_near_ties(name, tmp_path_factory):
    _, model, _, ids = built(name, tmp_path_factory)
    assert router_margin(model, ids) > ROUTER_MARGIN


@pytest.mark.parametrize("backend", [*BACKENDS, "torch"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_safetensors_matches_transformers(name, backend, tmp_path_factory):
    folder, _, expected, ids = built(name, tmp_path_factory)
    assert_logits_match(our_logits(folder, backend, ids), expected, MIN_COS)


def test_wrong_renormalisation_is_caught(tmp_path_factory):
    """The control: the same qwen3moe weights routed without renormalising miss the floor."""
    import json

    folder, _, expected, ids = built("qwen3moe", tmp_path_factory)
    config = json.loads((folder / "config.json").read_text())
    wrong = tmp_path_factory.mktemp("qwen3moe-unnormed")
    for f in folder.iterdir():
        (wrong / f.name).symlink_to(f)
    (wrong / "config.json").unlink()
    (wrong / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    ours = our_logits(wrong, "reference", ids)
    cos = (ours * expected).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert cos.min() < MIN_COS
