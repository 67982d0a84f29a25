"""The reference backend: numpy, float32, deterministic — the oracle every backend is held to.

Fixed orders, so that a row's bits never depend on the batch:
- matmul: one row at a time (`W @ x_row`, a BLAS GEMV of the same shape for every row);
- reductions over the last axis (norms, softmax sums) use numpy's per-row pairwise sum,
  which runs the same inner loop for each row whatever the number of rows;
- attention: one query row at a time over exactly its own keys 0..pos, in position order;
- mixture of experts: one token at a time, its chosen experts in its own top-k order.
Readable first, fast second.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agentkv.hal.base import (
    AttnMeta,
    Backend,
    Capabilities,
    KVSpec,
    Layout,
    RopeSpec,
    RopeStyle,
    Tensor,
    Weight,
    check_layout,
)
from agentkv.hal.rope import rope_tables

F32 = 0  # gguf.GGMLQuantizationType.F32
F32_ONLY = frozenset({Layout.ROW_MAJOR_F32})


KV_NUMPY = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2")}  # KVSpec.dtype -> element type


class RefKV:
    """Paged K/V: `k[layer]` and `v[layer]` are `[num_blocks, block_size, kvh, hd]` of the
    spec's dtype (float32 or float16; an f16 store is widened to f32, exactly, when read).
    A latent spec holds one array: `v` is `k` itself."""

    def __init__(self, spec: KVSpec):
        shape = (spec.num_layers, spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        dtype = KV_NUMPY[spec.dtype]
        self.spec, self.k = spec, np.zeros(shape, dtype)
        self.v = self.k if spec.latent else np.zeros(shape, dtype)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    from math import erf

    verf = np.vectorize(erf, otypes=[np.float64])
    return (0.5 * x.astype(np.float64) * (1.0 + verf(x.astype(np.float64) / math.sqrt(2.0)))).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu": _gelu_erf}


class ReferenceBackend(Backend):
    name = "reference"
    klass = "reference"

    @property
    def capabilities(self) -> Capabilities:
        # the oracle loops in Python over each row's keys (one fixed order, readable)
        return Capabilities(device="cpu", resident_qtypes=frozenset(), row_loops=frozenset({"attention"}))

    def upload(self, array: np.ndarray) -> Tensor:
        return Tensor(np.array(array, dtype=np.float32, copy=True))

    def upload_weight(self, name, data, qtype, shape, resident=True) -> Weight:
        from agentkv.formats.quants import dequantize

        arr = dequantize(np.asarray(data), qtype).reshape(shape).astype(np.float32)
        return Weight(np.ascontiguousarray(arr), shape, F32, name, layout=Layout.ROW_MAJOR_F32)

    def read(self, x: Tensor) -> np.ndarray:
        return np.array(x.raw, dtype=np.float32, copy=True)

    def argmax(self, x: Tensor) -> np.ndarray:
        return np.argmax(x.raw, axis=-1).astype(np.int64)

    def reshape(self, x: Tensor, shape) -> Tensor:
        return Tensor(x.raw.reshape(shape))

    def take_rows(self, x: Tensor, rows) -> Tensor:
        return Tensor(np.ascontiguousarray(x.raw[np.asarray(rows, dtype=np.int64)]))

    def split(self, x: Tensor, sizes: list[int]) -> list[Tensor]:
        return [Tensor(part) for part in np.split(x.raw, np.cumsum(sizes)[:-1], axis=-1)]

    def embedding(self, weight: Weight, ids) -> Tensor:
        check_layout(weight, F32_ONLY, "reference embedding")
        return Tensor(weight.raw[np.asarray(ids, dtype=np.int64)].copy())

    def lora_add(self, x: Tensor, y: Tensor, row_slots: np.ndarray, pieces) -> Tensor:
        from agentkv.hal.lora import lora_add_rows

        lora_add_rows(np.ascontiguousarray(x.raw), y.raw, row_slots, pieces, lambda w: w.raw)
        return y

    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        check_layout(weight, F32_ONLY, "reference matmul")  # numpy would cast quant bytes silently
        w, xs = weight.raw, np.ascontiguousarray(x.raw)
        out = np.empty((xs.shape[0], w.shape[0]), np.float32)
        for i in range(xs.shape[0]):  # one GEMV per row: the row's bits never see the batch
            out[i] = w @ xs[i]
        if bias is not None:
            out += bias.raw
        return Tensor(out)

    def rms_norm(self, x: Tensor, weight: Weight, eps: float, unit_offset: bool = False) -> Tensor:
        xs = x.raw
        ms = np.mean(xs * xs, axis=-1, keepdims=True, dtype=np.float32)
        gain = (np.float32(1.0) + weight.raw) if unit_offset else weight.raw
        return Tensor((xs / np.sqrt(ms + np.float32(eps))) * gain)

    def layer_norm(self, x: Tensor, weight: Weight, bias: Weight | None, eps: float) -> Tensor:
        xs = x.raw
        mean = np.mean(xs, axis=-1, keepdims=True, dtype=np.float32)
        centred = xs - mean
        var = np.mean(centred * centred, axis=-1, keepdims=True, dtype=np.float32)
        out = centred / np.sqrt(var + np.float32(eps)) * weight.raw
        return Tensor(out + bias.raw if bias is not None else out)

    def rope(self, x: Tensor, positions, spec: RopeSpec) -> Tensor:
        pos = np.asarray(positions, dtype=np.int64)
        cos_t, sin_t = rope_tables(spec, int(pos.max(initial=0)) + 1)
        cos, sin = cos_t[pos][:, None, :], sin_t[pos][:, None, :]  # [n, 1, dim/2]
        xs = x.raw.copy()
        rot = xs[..., : spec.dim]
        if spec.style is RopeStyle.NEOX:
            a, b = rot[..., : spec.dim // 2], rot[..., spec.dim // 2 :]
            rot[...] = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
        else:
            a, b = rot[..., 0::2].copy(), rot[..., 1::2].copy()
            rot[..., 0::2], rot[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        return Tensor(xs)

    def gated_act(self, gate: Tensor, up: Tensor, kind: str) -> Tensor:
        return Tensor(ACTIVATIONS[kind](gate.raw) * up.raw)

    def act(self, x: Tensor, kind: str) -> Tensor:
        return Tensor(ACTIVATIONS[kind](x.raw))

    def moe_ffn(self, x: Tensor, weights, spec) -> Tensor:
        """The plain loop: for each token, for each of its top-k experts in rank order, the
        expert's gated FFN as GEMVs, weighted and summed in that order; then the shared expert."""
        xs = np.ascontiguousarray(x.raw)
        logits = self.matmul(x, weights.router).raw  # [n, num_experts]
        act, ex = ACTIVATIONS[spec.act], weights.experts
        out = np.zeros_like(xs)
        bias = None if weights.score_bias is None else weights.score_bias.raw.reshape(-1)
        for t in range(xs.shape[0]):
            chosen, probs = route_row(logits[t], spec, bias)
            for e, p in zip(chosen, probs):
                hidden = act(ex.gate[e].raw @ xs[t]) * (ex.up[e].raw @ xs[t])
                out[t] += p * (ex.down[e].raw @ hidden)
        if weights.shared is not None:
            from agentkv.hal.blocks import shared_expert

            shared, gate = shared_expert(self, x, weights.shared, spec.act)
            scale = np.float32(1.0) if gate is None else np.float32(1.0) / (np.float32(1.0) + np.exp(-gate.raw))
            out = out + scale * shared.raw
        return Tensor(out)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return Tensor(a.raw + b.raw)

    def scale(self, x: Tensor, factor: float) -> Tensor:
        return Tensor(x.raw * np.float32(factor))

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        c = np.float32(cap)
        return Tensor(np.tanh(x.raw / c) * c)

    def allocate_kv(self, spec: KVSpec) -> Any:
        return RefKV(self.check_kv_spec(spec))

    def kv_store(self, kv: RefKV, layer: int, k: Tensor, v: Tensor, slot_mapping) -> None:
        slots = np.asarray(slot_mapping, dtype=np.int64)
        bs = kv.spec.block_size
        with np.errstate(over="ignore"):  # numpy's cast to f16: nearest even, past 65504 -> inf
            kv.k[layer, slots // bs, slots % bs] = k.raw
            kv.v[layer, slots // bs, slots % bs] = v.raw

    def copy_blocks(self, kv: RefKV, pairs) -> None:
        for src, dst in pairs:
            kv.k[:, dst] = kv.k[:, src]
            kv.v[:, dst] = kv.v[:, src]

    def read_block(self, kv: RefKV, block: int) -> bytes:
        stores = [kv.k[:, block]] if kv.spec.latent else [kv.k[:, block], kv.v[:, block]]
        return np.ascontiguousarray(np.stack(stores, axis=1), kv.k.dtype).tobytes()

    def write_block(self, kv: RefKV, block: int, data: bytes) -> None:
        s = kv.spec
        shape = (s.num_layers, s.num_stores, s.block_size, s.num_kv_heads, s.head_dim)
        arr = np.frombuffer(data, kv.k.dtype).reshape(shape)
        kv.k[:, block] = arr[:, 0]
        if not s.latent:
            kv.v[:, block] = arr[:, 1]

    def attention(
        self,
        q: Tensor,
        kv: RefKV,
        layer: int,
        meta: AttnMeta,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        return self.attention_sinks(q, kv, layer, meta, scale, window, None, softcap)

    def attention_sinks(self, q: Tensor, kv: RefKV, layer: int, meta: AttnMeta, scale, window, sinks, softcap=None):
        """`attention` where each head's learned logit `sinks` `[h]` (a Weight, or None) joins
        every row's softmax denominator (gpt-oss), after the row's own keys."""
        qs = q.raw
        n, h, hd = qs.shape
        sink = None if sinks is None else sinks.raw.reshape(kv.spec.num_kv_heads, -1, 1)  # [kvh, g, 1]
        kvh = kv.spec.num_kv_heads
        out = np.empty_like(qs)
        for start, qlen, ctx, table in zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables):
            blocks = np.asarray(table, dtype=np.int64)
            # f32 either way: an f16 store's values widened exactly, then the f32 arithmetic
            keys = kv.k[layer, blocks].reshape(-1, kvh, hd)[:ctx].astype(np.float32)
            vals = kv.v[layer, blocks].reshape(-1, kvh, hd)[:ctx].astype(np.float32)
            keys, vals = keys.transpose(1, 2, 0), vals.transpose(1, 0, 2)  # [kvh, hd, ctx], [kvh, ctx, hd]
            for r in range(start, start + qlen):
                pos = int(meta.positions[r])
                lo = max(0, pos + 1 - window) if window else 0
                qr = qs[r].reshape(kvh, h // kvh, hd)
                att = _attend_row(qr, keys[:, :, lo : pos + 1], vals[:, lo : pos + 1], scale, softcap, sink)
                out[r] = att.reshape(h, hd)
        return Tensor(out)

    def attention_dense(self, q: Tensor, k: Tensor, v: Tensor, seq_lens, scale: float) -> Tensor:
        qs, ks, vs = q.raw, k.raw, v.raw
        n, h, hd = qs.shape
        kvh = ks.shape[1]
        out = np.empty_like(qs)
        start = 0
        for length in seq_lens:
            keys = ks[start : start + length].transpose(1, 2, 0)
            vals = vs[start : start + length].transpose(1, 0, 2)
            for r in range(start, start + length):
                qr = qs[r].reshape(kvh, h // kvh, hd)
                out[r] = _attend_row(qr, keys, vals, scale, None).reshape(h, hd)
            start += length
        return Tensor(out)


def route_row(logits: np.ndarray, spec, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One token's router logits `[num_experts]` -> (its top-k experts by falling probability,
    lowest index first on a tie; their weights, float32 `[top_k]`), as `spec` routes (sigmoid,
    correction bias and groups: hal/routing.py)."""
    from agentkv.hal.routing import plain, route_row_np

    if not plain(spec, bias):
        return route_row_np(logits, bias, spec)
    k = spec.top_k
    if spec.softmax_after_topk:
        chosen = np.argsort(-logits, kind="stable")[:k]
        probs = _softmax(logits[chosen])
    else:
        probs_all = _softmax(logits)
        chosen = np.argsort(-probs_all, kind="stable")[:k]
        probs = probs_all[chosen]
        if spec.norm_topk:
            probs = probs / probs.sum(dtype=np.float32)
    return chosen, (probs * np.float32(spec.weights_scale)).astype(np.float32)


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum(dtype=np.float32)


def _attend_row(qr, keys, vals, scale: float, softcap: float | None, sink=None) -> np.ndarray:
    """One query row: qr `[kvh, g, hd]`, keys `[kvh, hd, L]`, vals `[kvh, L, hd]` -> `[kvh, g, hd]`;
    `sink` `[kvh, g, 1]` (or None): a logit per head that joins the denominator, never a value."""
    scores = np.matmul(qr, np.ascontiguousarray(keys)) * np.float32(scale)
    if softcap:
        c = np.float32(softcap)
        scores = np.tanh(scores / c) * c
    top = scores.max(axis=-1, keepdims=True)
    if sink is not None:
        top = np.maximum(top, sink)
    scores = np.exp(scores - top)
    denom = scores.sum(axis=-1, keepdims=True, dtype=np.float32)
    probs = scores / (denom if sink is None else denom + np.exp(sink - top))
    return np.matmul(probs, np.ascontiguousarray(vals))
