"""Typed decoder-block weights (hal/blocks.py): a layer missing a required weight is refused
with an error naming it, and the FFN seam works: a new FFN kind, registered with `ffn_op`,
runs inside `Backend.decoder_block` with the attention part untouched, on the composed path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from agentkv.hal.base import AttnMeta, KVSpec, RopeSpec, Weight
from agentkv.hal.blocks import (
    AttentionSpec,
    AttentionWeights,
    BlockSpec,
    DecoderLayer,
    DenseFFN,
    DenseFFNSpec,
    MissingWeight,
    Projection,
    ffn_op,
)
from agentkv.hal.cpu import CpuBackend
from agentkv.hal.portable import TorchBackend
from agentkv.hal.reference import ReferenceBackend

D, H, KVH, HD, F, N = 32, 4, 2, 8, 48, 5
SPEC = AttentionSpec(H, KVH, HD, RopeSpec(dim=HD), eps=1e-6)


def weight(be, rng, shape, name="w", offset=0.0) -> Weight:
    data = (offset + 0.3 * rng.standard_normal(shape)).astype(np.float32)
    return be.upload_weight(name, data, 0, data.shape)


def attention(be, rng) -> AttentionWeights:
    qkv = Projection(
        (weight(be, rng, (H * HD, D), "q"), weight(be, rng, (KVH * HD, D), "k"), weight(be, rng, (KVH * HD, D), "v"))
    )
    return AttentionWeights(norm=weight(be, rng, (D,), "attn_norm", 1.0), qkv=qkv, o=weight(be, rng, (D, H * HD), "o"))


@dataclass(frozen=True, slots=True)
class LinearFFN:
    """A test-only FFN kind: one linear map, no gate. `norm`/`post_norm` as every FFN kind has."""

    norm: Weight
    proj: Weight
    post_norm: Weight | None = None


@dataclass(frozen=True, slots=True)
class LinearFFNSpec:
    scale: float


CALLS: list[str] = []


@ffn_op.register(LinearFFN)
def _linear_ffn(weights: LinearFFN, backend, x, spec: LinearFFNSpec):
    CALLS.append(backend.name)
    return backend.scale(backend.matmul(x, weights.proj), spec.scale)


def run_block(be, layer: DecoderLayer, ffn_spec, x_np: np.ndarray, next_norm: Weight):
    """(h, normed, kv) after one decoder block on a fresh one-layer KV store."""
    kv = be.allocate_kv(KVSpec(1, 2, 16, KVH, HD))
    meta = AttnMeta((N,), (N,), ((0,),), np.arange(N, dtype=np.int64), np.arange(N, dtype=np.int64))
    # copies: the torch upload shares x_np's memory and add_norm may update h in place
    h, x = be.upload(x_np.copy()), be.rms_norm(be.upload(x_np.copy()), layer.attention.norm, SPEC.eps)
    h, normed = be.decoder_block(h, x, layer, BlockSpec(SPEC, ffn_spec), meta, kv, 0, next_norm)
    return be.read(h), be.read(normed), kv


def by_hand(be, layer: DecoderLayer, spec: LinearFFNSpec, x_np: np.ndarray, next_norm: Weight):
    """The same block composed op by op, the FFN written out: the oracle for the seam."""
    kv = be.allocate_kv(KVSpec(1, 2, 16, KVH, HD))
    meta = AttnMeta((N,), (N,), ((0,),), np.arange(N, dtype=np.int64), np.arange(N, dtype=np.int64))
    att, ffn = layer.attention, layer.ffn
    h, x = be.upload(x_np.copy()), be.rms_norm(be.upload(x_np.copy()), att.norm, SPEC.eps)
    q = be.attention_inputs([be.matmul(x, w) for w in att.qkv.weights], meta, kv, 0, SPEC)
    out = be.matmul(be.reshape(be.attention(q, kv, 0, meta, SPEC.scale), (N, H * HD)), att.o)
    h, x = be.add_norm(h, out, ffn.norm, SPEC.eps)
    h, normed = be.add_norm(h, be.scale(be.matmul(x, ffn.proj), spec.scale), next_norm, SPEC.eps)
    return be.read(h), be.read(normed)


@pytest.mark.parametrize(
    "backend", [ReferenceBackend(), TorchBackend(), CpuBackend()], ids=["reference", "torch", "cpu"]
)
def test_new_ffn_kind_runs_inside_the_block(backend):
    rng = np.random.default_rng(3)
    att, x_np = attention(backend, rng), rng.standard_normal((N, D)).astype(np.float32)
    ffn_norm, next_norm = weight(backend, rng, (D,), "ffn_norm", 1.0), weight(backend, rng, (D,), "out", 1.0)
    layer = DecoderLayer(att, LinearFFN(ffn_norm, weight(backend, rng, (D, D), "proj")))
    CALLS.clear()
    h, normed, kv = run_block(backend, layer, LinearFFNSpec(0.5), x_np, next_norm)
    assert CALLS == [backend.name]  # the block reached the new kind's op, once
    want_h, want_normed = by_hand(backend, layer, LinearFFNSpec(0.5), x_np, next_norm)
    assert np.array_equal(h, want_h) and np.array_equal(normed, want_normed)
    if isinstance(backend, CpuBackend):  # no compiled block for a kind it does not know
        assert kv.decoder_blocks[0][3] is None
    # control: the same attention with a dense FFN gives other bits (the check can fail)
    gate_up = Projection((weight(backend, rng, (F, D), "gate"), weight(backend, rng, (F, D), "up")))
    dense = DecoderLayer(att, DenseFFN(ffn_norm, gate_up, weight(backend, rng, (D, F), "down")))
    dense_h, _, dense_kv = run_block(backend, dense, DenseFFNSpec("silu"), x_np, next_norm)
    assert not np.array_equal(dense_h, h)
    if isinstance(backend, CpuBackend):
        assert dense_kv.decoder_blocks[0][3] is not None  # the dense kind does run compiled


def test_unregistered_ffn_kind_is_refused():
    be, rng = ReferenceBackend(), np.random.default_rng(4)

    @dataclass(frozen=True)
    class UnknownFFN:
        norm: Weight

    layer = DecoderLayer(attention(be, rng), UnknownFFN(weight(be, rng, (D,), "n", 1.0)))
    with pytest.raises(TypeError, match="UnknownFFN"):
        run_block(be, layer, None, rng.standard_normal((N, D)).astype(np.float32), weight(be, rng, (D,)))


def test_missing_required_weight_is_named():
    be, rng = ReferenceBackend(), np.random.default_rng(5)
    att = attention(be, rng)
    with pytest.raises(MissingWeight, match=r"AttentionWeights\.o: a required weight is missing"):
        AttentionWeights(norm=att.norm, qkv=att.qkv, o=None)
    with pytest.raises(MissingWeight, match=r"DenseFFN\.down"):
        DenseFFN(norm=att.norm, gate_up=Projection((att.o, att.o)), down=None)
    with pytest.raises(MissingWeight, match=r"Projection\.weights\[1\]"):
        Projection((att.o, None, att.o))
    with pytest.raises(MissingWeight, match=r"DecoderLayer\.ffn: LinearFFN has no norm"):
        DecoderLayer(att, LinearFFN(None, att.o))
    # control: the same parts, complete, are accepted
    assert AttentionWeights(norm=att.norm, qkv=att.qkv, o=att.o).o is att.o


def test_bad_spec_is_named():
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        AttentionSpec(6, 4, HD, RopeSpec(dim=HD))
    with pytest.raises(ValueError, match="rope.dim=16 exceeds head_dim=8"):
        AttentionSpec(H, KVH, HD, RopeSpec(dim=16))
    with pytest.raises(ValueError, match="'relu'"):
        DenseFFNSpec("relu")
    assert AttentionSpec(H, KVH, HD, RopeSpec(dim=HD)).scale == 1.0 / np.sqrt(HD)
