"""Witness rows of the DeepSeek / GLM pieces: latent attention (hal/mla.py) over a latent KV
store, its sparse variant (hal/mla_sparse.py), and the sigmoid, grouped, bias-corrected router
(hal/routing.py) inside the MoE op, each against the reference.

Only summation order differs from the reference (f32 weights), so the f32 floor holds; the
router's scores are scaled so that no top-k or group choice is near a tie."""

from __future__ import annotations

import math

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, KVSpec, RopeSpec, RopeStyle

COSINE_FLOOR_MLA = 0.99999  # = COSINE_FLOOR_F32


def _weights(be: Backend, seed: int, sparse: bool):
    """A random latent-attention layer: d 64, 4 heads, nope 16, rope 8, v 16, kv rank 32, q rank 24."""
    from agentkv.hal.mla import MLASpec, MLAWeights, kv_b_heads
    from agentkv.hal.mla_sparse import IndexerSpec, IndexerWeights

    r = np.random.default_rng(seed)
    up = lambda shape, scale=0.2: be.upload_weight("w", (r.standard_normal(shape) * scale).astype(np.float32), 0, shape)  # noqa: E731
    rope = RopeSpec(8, 10000.0, RopeStyle.INTERLEAVED)
    spec = MLASpec(4, 16, 8, 16, 32, rope, 1 / math.sqrt(24), 1e-6)
    uk, uv = kv_b_heads((r.standard_normal((4 * 32, 32)) * 0.2).astype(np.float32), spec)
    weights = MLAWeights(
        norm=up((64,)),
        kv_a=up((40, 64)),
        kv_a_norm=up((32,), 1.0),
        uk=tuple(be.upload_weight("uk", a, 0, a.shape) for a in uk),
        uv=tuple(be.upload_weight("uv", a, 0, a.shape) for a in uv),
        o=up((64, 64)),
        q_a=up((24, 64)),
        q_a_norm=up((24,), 1.0),
        q_b=up((4 * 24, 24)),
    )
    if not sparse:
        return weights, spec, None
    index = IndexerWeights(up((8 * 16, 24)), up((16, 64)), up((16,), 1.0), up((16,), 0.1), up((8, 64)))
    return weights, spec, (index, IndexerSpec(8, 16, 5, RopeSpec(8, 10000.0, RopeStyle.NEOX)))


def mla_case(be: Backend, sparse: bool) -> np.ndarray:
    """Two sequences (23 and 9 tokens) in one step, blocks of 4, into a latent store."""
    from agentkv.hal.mla import mla_attention
    from agentkv.hal.mla_sparse import sparse_mla_attention

    w, spec, index = _weights(be, 41, sparse)
    width = spec.latent_dim + (16 if sparse else 0)
    kv = be.allocate_kv(KVSpec(1, 12, 4, 1, width, be.kv_dtype, latent=True))
    lens, tables = (23, 9), ((1, 2, 3, 4, 5, 6), (7, 8, 9))
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    slots = np.concatenate([np.asarray(t)[np.arange(n) // 4] * 4 + np.arange(n) % 4 for t, n in zip(tables, lens)])
    meta = AttnMeta(lens, lens, tables, pos, slots.astype(np.int64))
    x = be.upload(np.random.default_rng(43).standard_normal((sum(lens), 64)).astype(np.float32))
    if sparse:
        return be.read(sparse_mla_attention(be, x, w, spec, index, meta, kv, 0))
    return be.read(mla_attention(be, x, w, spec, meta, kv, 0))


def routed_case(be: Backend) -> np.ndarray:
    """DeepSeek-V3's router: sigmoid scores, a correction bias, 4 groups of 4, 2 kept, top 3."""
    from agentkv.hal.blocks import MoEFFN, MoEFFNSpec, ffn_op
    from agentkv.witness.ops import _moe_layer

    layer = _moe_layer(be, 31, 0, True, num=16)
    bias = be.upload_weight("b", np.random.default_rng(5).standard_normal(16).astype(np.float32), 0, (16,))
    layer = MoEFFN(layer.norm, layer.router, layer.experts, layer.shared, score_bias=bias)
    spec = MoEFFNSpec(16, 3, True, weights_scale=2.5, scoring="sigmoid", num_groups=4, top_groups=2)
    x = be.upload(np.random.default_rng(37).standard_normal((21, 64)).astype(np.float32))
    return be.read(ffn_op(layer, be, x, spec))


def mla_cases():
    return [
        ("mla_attention", "h=4,rank=32,rope=8,lens=(23,9)", lambda be: mla_case(be, False), COSINE_FLOOR_MLA, False),
        ("mla_attention/sparse", "h=4,index=8x16,top_k=5", lambda be: mla_case(be, True), COSINE_FLOOR_MLA, False),
        ("moe_ffn/sigmoid_groups_bias", "n=21,experts=16,groups=4", routed_case, COSINE_FLOOR_MLA, False),
    ]
