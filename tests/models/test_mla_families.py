"""DeepSeek-V2 / V3 (multi-head latent attention, softmax or sigmoid routing with groups and the
correction bias, shared experts, a leading dense layer), DeepSeek-V3.2 (the same with sparse
attention over its indexer's top-k keys) and GLM-4.5 MoE (partial rotary, q/k/v
biases, sigmoid routing with bias and groups) against HF transformers, from tiny random models
saved as safetensors by transformers itself.

Tolerance: cosine >= 0.99999 per position and equal argmax (float32 both sides; the absorbed
MLA form sums in another order than HF's expanded one). It holds only while every token picks
the same experts on both sides, so the routers' decisions are first asserted to have margins
(the kept groups' and the chosen experts' scores beat the next by ROUTER_MARGIN). The controls
change one convention (the rope pair layout, the group limit, the renormalisation) and miss
the floor, so the comparison can fail."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import family_config, load_model
from tests.models.helpers import BACKENDS, assert_logits_match, cosines, hf_logits, our_logits, prompt, tiny_hf_model

MIN_COS = 0.99999
ROUTER_MARGIN = 1e-3
PROMPT_LEN = 13
EXPERTS = dict(num_experts_per_tok=2, n_routed_experts=8, moe_intermediate_size=32, n_shared_experts=1)
MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4)
YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=64,
    mscale=0.707,  # = mscale_all_dim, as DeepSeek-V3's config (llama.cpp assumes it)
    mscale_all_dim=0.707,
    beta_fast=32,
    beta_slow=1,
)
FAMILIES = {
    "deepseek_v2": dict(  # V2-Lite's shape: a full-rank q, greedy softmax routing, unnormalised
        **EXPERTS, **MLA, q_lora_rank=None, topk_method="greedy", norm_topk_prob=False, first_k_dense_replace=1
    ),
    "deepseek_v3": dict(  # low-rank q, sigmoid + bias, 2 groups (1 kept), YaRN with DeepSeek's mscale
        **EXPERTS,
        **MLA,
        q_lora_rank=24,
        scoring_func="sigmoid",  # as DeepSeek-V3's own config says it (llama.cpp's converter reads it)
        topk_method="noaux_tc",
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,
        rope_parameters=YARN,
    ),
    "deepseek_v32": dict(  # V3 with sparse attention: each query attends its indexer's top 4 keys
        **EXPERTS,
        **MLA,
        q_lora_rank=24,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,
        index_n_heads=8,  # 2 heads leave keys tied at relu(.) = 0 across the top-k boundary
        index_head_dim=16,
        index_topk=4,
    ),
    "glm4_moe": dict(
        **EXPERTS,
        head_dim=16,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        num_hidden_layers=3,
        attention_bias=True,
        num_nextn_predict_layers=0,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    ),
}
SEEDS = {"deepseek_v2": 0, "deepseek_v3": 0, "deepseek_v32": 0, "glm4_moe": 0}  # seeds whose routers clear the margin
# byte tokens plus the specials llama.cpp's GLM converter looks up (so every family converts)
SPECIALS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|observation|>", "<pad>")
VOCAB = 264
_BUILT: dict[str, tuple] = {}


def build(folder, model_type: str, seed: int | None = None, **overrides):
    """The tiny model saved in `folder`, its correction biases random (HF zeroes them)."""
    spec = {"vocab_size": VOCAB, "max_position_embeddings": 512, **FAMILIES[model_type], **overrides}
    model = tiny_hf_model(folder, model_type, seed=SEEDS[model_type] if seed is None else seed, **spec)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in model.model.layers:
            bias = getattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(0.2 * torch.randn(bias.shape, generator=gen))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def tokenizer_files(folder) -> None:
    """A byte-level tokenizer.json (one merge) with SPECIALS as added tokens (ids 257..263, so
    every id of the VOCAB has a token), and a
    tokenizer_config.json naming the fast tokenizer class, as llama.cpp's converter reads them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate([*alphabet, "\u0120\u0120"])}  # one merge: llama.cpp needs merges
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("\u0120", "\u0120")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def built_family(model_type: str, tmp_path_factory, **overrides) -> tuple:
    """(folder, HF logits, router margin, prompt) of one family's tiny model (with `overrides`
    to its config), built once per session (the GGUF comparison reuses it)."""
    key = model_type + json.dumps(overrides, sort_keys=True)
    if key not in _BUILT:
        folder = tmp_path_factory.mktemp(model_type)
        model = build(folder, model_type, **overrides)
        tokenizer_files(folder)
        ids = prompt(PROMPT_LEN)
        _BUILT[key] = folder, *logits_and_margin(model, ids), ids
    return _BUILT[key]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """model type -> (folder, HF logits, router margin, prompt)."""
    return {model_type: built_family(model_type, tmp_path_factory) for model_type in FAMILIES}


def logits_and_margin(model, ids: list[int]) -> tuple[np.ndarray, float]:
    """HF's logits and the smallest gap, over MoE layers and positions, between the last kept
    and the first dropped group score and between the k-th and (k+1)-th expert choice score in
    the kept groups, as the family's router computes them (float64)."""
    cfg, gaps, hooks = model.config, [], []
    k, groups = cfg.num_experts_per_tok, getattr(cfg, "n_group", None) or 1
    kept = getattr(cfg, "topk_group", None) or groups
    sigmoid = cfg.model_type != "deepseek_v2"
    if cfg.model_type == "deepseek_v2" and getattr(cfg, "topk_method", "greedy") == "greedy":
        groups = kept = 1

    def hook(module, args, _out):
        logits = args[0].reshape(-1, args[0].shape[-1]).double() @ module.weight.double().T
        scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
        bias = getattr(module, "e_score_correction_bias", None)
        choice = scores + bias.double() if bias is not None else scores
        grouped = choice.reshape(len(choice), groups, -1)
        if groups > 1:
            by_group = grouped.topk(2, dim=-1).values.sum(-1) if sigmoid else grouped.max(-1).values
            ranked = by_group.sort(dim=-1, descending=True).values
            gaps.append(float((ranked[:, kept - 1] - ranked[:, kept]).min()))
            drop = by_group.argsort(dim=-1, descending=True)[:, kept:]
            grouped = grouped.scatter(1, drop[..., None].expand(-1, -1, grouped.shape[-1]), float("-inf"))
        ranked = grouped.reshape(len(choice), -1).sort(dim=-1, descending=True).values
        gaps.append(float((ranked[:, k - 1] - ranked[:, k]).min()))

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight"):
            hooks.append(gate.register_forward_hook(hook))
        indexer = getattr(layer.self_attn, "indexer", None)
        if indexer is not None:
            hooks.append(indexer.register_forward_hook(lambda m, args, _out: gaps.append(index_margin(m, *args[:4]))))
    logits = hf_logits(model, ids)
    for h in hooks:
        h.remove()
    return logits, min(gaps)


def index_margin(indexer, hidden, q_resid, rope, mask) -> float:
    """The smallest gap between the k-th and (k+1)-th index score of any query with more than
    k keys, recomputed from DeepSeek-V3.2's indexer modules as its forward computes them."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    b, s, _ = hidden.shape
    heads, dim, rot = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(b, s, heads, dim).double()
    k = indexer.k_norm(indexer.wk(hidden)).unsqueeze(2).double()
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :rot], k[..., :rot], *(t.double() for t in rope), unsqueeze_dim=2)
    q, k = torch.cat([q_rot, q[..., rot:]], -1), torch.cat([k_rot, k[..., rot:]], -1).squeeze(2)
    scores = torch.relu(torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(hidden).double() * heads**-0.5
    index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [b, s, t]
    index = index.masked_fill(~mask if mask.dtype == torch.bool else mask < 0, float("-inf"))
    ranked = index.sort(dim=-1, descending=True).values[0]
    top = indexer.index_topk
    gaps = [float(ranked[i, top - 1] - ranked[i, top]) for i in range(top, s)]  # query i has i + 1 keys
    return min(gaps, default=float("inf"))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_router_decisions_are_not_near_ties(model_type, built):
    assert built[model_type][2] > ROUTER_MARGIN


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_safetensors_matches_transformers(model_type, backend, built):
    folder, expected, _, ids = built[model_type]
    assert_logits_match(our_logits(folder, backend, ids), expected, MIN_COS)


@pytest.mark.parametrize(
    "model_type,change",
    [
        ("deepseek_v3", {"rope_interleave": False}),  # the rope pairs of q/k's rope columns
        ("deepseek_v3", {"n_group": 1, "topk_group": 1}),  # no group limit on the choice
        ("glm4_moe", {"norm_topk_prob": False}),
        ("deepseek_v32", {"index_topk": 64}),  # every key attended: the sparse choice matters
    ],
)
def test_a_wrong_convention_misses_the_floor(model_type, change, built, tmp_path):
    """The control: the same weights read under one changed config key miss the floor."""
    folder, expected, _, ids = built[model_type]
    config = json.loads((folder / "config.json").read_text())
    for f in folder.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    assert cosines(our_logits(tmp_path, "reference", ids), expected).min() < MIN_COS


def test_latent_kv_bytes_per_token_against_multi_head(built):
    """inspect's KV bytes per token: one latent row (kv_lora_rank + rope) per layer, against
    h * (nope + rope + v) for the same model with multi-head K/V; the store allocates the former."""
    folder = built["deepseek_v2"][0]
    summary = family_config(open_model(folder)).summary()
    layers, heads = 2, 4
    assert summary["kv_layout"] == "latent"
    assert summary["kv_bytes_per_token_f16"] == layers * (32 + 8) * 2
    assert summary["kv_bytes_per_token_f16_multi_head"] == layers * heads * (16 + 8 + 16) * 2
    model = load_model(open_model(folder), lookup("reference").set_kv_dtype("f16"))
    spec = model.kv_spec(4, 16)
    assert spec.latent and spec.bytes_per_token == summary["kv_bytes_per_token_f16"]
    assert np.isclose(summary["kv_bytes_per_token_f16_multi_head"] / spec.bytes_per_token, 4.0)


def test_a_latent_config_without_its_rank_is_refused_by_name(built, tmp_path):
    """A bad config.json is a clear error naming the key and the value, not a shape crash."""
    from agentkv.formats.errors import FormatError

    folder = built["deepseek_v3"][0]
    config = json.loads((folder / "config.json").read_text())
    for f in folder.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, "kv_lora_rank": None}))
    with pytest.raises(FormatError, match="kv_lora_rank is None"):
        family_config(open_model(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_group": 3}))
    with pytest.raises(FormatError, match="expert groups 3"):
        family_config(open_model(tmp_path))
