"""Recurrent state of hybrid models (gated DeltaNet layers): the state slots and the op that
runs the causal conv and the gated delta rule over them, in one fixed order.

Exactness: the recurrence runs one token at a time, each token's arithmetic on arrays of
fixed shapes, so the state after position p has the same bits whether p was reached in one
prefill, in chunks cut anywhere, in a batch or after a resume from a snapshot. Every backend
runs this numpy code on host copies of its tensors (the op's only fences).

The state slots, snapshots and speculation's rollback: `hal/state_store.py` (StateStore,
`resume_state`, `keep_state`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, Tensor
from agentkv.hal.state_store import StateStore, keep_state, resume_state, state_rows


@dataclass(frozen=True, slots=True)
class DeltaNetSpec:
    """Shapes of one gated DeltaNet layer and how its projections come:

        layout "flat":  [q|k|v, z, b, a]                  (qwen3_5, GGUF qwen35)
        layout "ba":    [q|k|v, z, ba grouped by key head] (GGUF qwen3next)
        layout "qkvz":  [qkvz grouped by key head, ba grouped by key head] (HF qwen3_next)

    Value head j reads key head j // (num_v / num_k) (HF's interleaved repeat), or with
    `tiled` key head j % num_k (llama.cpp's converter reorders qwen35's value heads so)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float
    layout: str = "flat"
    tiled: bool = False

    def __post_init__(self):
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DeltaNetSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.layout not in ("flat", "ba", "qkvz"):
            raise ValueError(f"DeltaNetSpec.layout={self.layout!r}: use 'flat', 'ba' or 'qkvz'")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"DeltaNetSpec.num_v_heads={self.num_v_heads} must be a multiple of num_k_heads={self.num_k_heads}"
            )

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_dim)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    @property
    def state_bytes(self) -> int:
        """Conv state plus recurrent state of one slot, f32."""
        return 4 * (int(np.prod(self.conv_shape)) + int(np.prod(self.recurrent_shape)))


@dataclass(frozen=True, slots=True)
class DeltaNetWeights:
    """Host arrays of one layer's small parameters: the depthwise conv `[conv_dim, kernel]`,
    the decay `a_neg` = -exp(A_log) `[num_v_heads]`, `dt_bias` `[num_v_heads]` and the gated
    norm's gain `[head_v_dim]`."""

    conv: np.ndarray
    a_neg: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def _l2norm(x: np.ndarray) -> np.ndarray:
    """FLA's l2norm over the last dim: x / sqrt(sum(x^2) + 1e-6)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))


def _split_projections(host: list[np.ndarray], spec: DeltaNetSpec) -> tuple[np.ndarray, ...]:
    """(qkv `[n, conv_dim]` as q|k|v, z `[n, value_dim]`, b, a `[n, num_v_heads]`) from the
    projections in `spec.layout`."""
    if spec.layout == "flat":
        return tuple(host)
    n, hk, dk = host[0].shape[0], spec.num_k_heads, spec.head_k_dim
    r = spec.num_v_heads // hk
    ba = host[-1].reshape(n, hk, 2 * r)
    b, a = ba[..., :r].reshape(n, -1), ba[..., r:].reshape(n, -1)
    if spec.layout == "ba":
        return host[0], host[1], b, a
    qkvz = host[0]
    g = qkvz.reshape(n, hk, 2 * dk + 2 * r * spec.head_v_dim)
    q, k = g[..., :dk], g[..., dk : 2 * dk]
    v, z = g[..., 2 * dk : 2 * dk + r * spec.head_v_dim], g[..., 2 * dk + r * spec.head_v_dim :]
    qkv = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], axis=1)
    return qkv, z.reshape(n, -1), b, a


def delta_net(
    be: Backend,
    projections: list[Tensor],
    weights: DeltaNetWeights,
    spec: DeltaNetSpec,
    store: StateStore,
    layer: int,
    meta: AttnMeta,
) -> Tensor:
    """The gated DeltaNet mixer between the input projections and the output projection:
    conv (rolling state) + silu, q/k L2 norm, the gated delta rule, the gated RMSNorm.
    `projections`: see `_split_projections`. Reads and writes the sequences' state slots in
    `store` layer `layer` (mutates). -> `[n, value_dim]`."""
    qkv, z, b, a = _split_projections([be.read(t) for t in projections], spec)
    beta = _sigmoid(b)
    g = weights.a_neg * _softplus(a + weights.dt_bias)  # [n, Hv]
    if all(num == 1 for num in meta.query_lens) and not store.recording:
        return be.upload(_decode(be, (qkv, z, np.exp(g), beta), meta, weights, spec, (store, layer)))
    out = np.empty((qkv.shape[0], spec.num_v_heads, spec.head_v_dim), np.float32)
    spans = zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables)
    for i, (start_row, num, ctx, table) in enumerate(spans):
        rows = slice(start_row, start_row + num)
        out[rows] = _sequence(be, (qkv[rows], g[rows], beta[rows]), ctx - num, (table, i), weights, spec, store, layer)
    y = be.gated_rms_norm(out, np.ascontiguousarray(z, np.float32), weights.norm, spec.eps)
    return be.upload(y)


def gated_rms_norm_reference(out: np.ndarray, z: np.ndarray, norm: np.ndarray, eps: float) -> np.ndarray:
    """numpy (`Backend.gated_rms_norm`'s default): per row and head of `out` `[n, H, dv]`,
    `rms_norm(out) * norm * silu(z)`, z `[n, H * dv]` -> `[n, H * dv]`."""
    y = out * (np.float32(1) / np.sqrt((out * out).mean(-1, keepdims=True) + np.float32(eps)))
    z = z.reshape(out.shape)
    y = (norm * y) * (z * _sigmoid(z))
    return np.ascontiguousarray(y.reshape(out.shape[0], -1), np.float32)


def delta_net_inputs_reference(window: np.ndarray, conv_w: np.ndarray, spec: DeltaNetSpec) -> tuple[np.ndarray, ...]:
    """numpy (`Backend.delta_net_inputs`' default): the causal conv over the window `[K - 1 + n,
    C]` (conv state, then the rows; `conv_w` `[C, K]`, taps summed in order), silu, q and k L2
    normed per key head and repeated to the value heads, q scaled by 1/sqrt(dk) -> (q, k
    `[n, Hv, dk]`, v `[n, Hv, dv]`)."""
    kernel = spec.conv_kernel
    num = window.shape[0] - (kernel - 1)
    conv = window[0:num] * conv_w[:, 0]
    for tap in range(1, kernel):  # taps summed in one fixed order
        conv = conv + window[tap : tap + num] * conv_w[:, tap]
    conv = conv * _sigmoid(conv)
    kd = spec.key_dim
    r = spec.num_v_heads // spec.num_k_heads
    heads = (lambda x: np.tile(x, (1, r, 1))) if spec.tiled else (lambda x: x.repeat(r, axis=1))
    q = heads(_l2norm(conv[:, :kd].reshape(num, spec.num_k_heads, spec.head_k_dim)))
    k = heads(_l2norm(conv[:, kd : 2 * kd].reshape(num, spec.num_k_heads, spec.head_k_dim)))
    q = q * np.float32(1.0 / np.sqrt(spec.head_k_dim))
    v = np.ascontiguousarray(conv[:, 2 * kd :].reshape(num, spec.num_v_heads, spec.head_v_dim))
    return q, k, v


def _sequence(be, rows, start, where, weights, spec, store, layer) -> np.ndarray:
    """One sequence's rows `(qkv, g, beta)` at positions [start, start + len(qkv)), the delta
    rule on `be` (`where`: its block table and chunk index): returns its core outputs `[len, Hv, dv]` and leaves the
    state after each block end it passes, and after its last row, in the slot of that
    position's block; a verification chunk also records the state after every row."""
    qkv, g, beta = rows
    table, index = where
    record = store.recording.get(index)
    kernel = spec.conv_kernel
    conv_state, rec = resume_state(store, layer, table, start, copy=False)
    # A running state (no snapshot) is this sequence's alone and superseded by this chunk's.
    inplace = start == 0 or table[(start - 1) // store.block_size] not in store.snapshots
    num = qkv.shape[0]
    window = np.concatenate([conv_state, qkv], axis=0)  # [K - 1 + num, C]
    q, k, v = be.delta_net_inputs(window, weights.conv, spec)
    where_state = (layer, table, record)
    rows = state_rows(store, record, start, num)
    out, states = be.delta_rule(q, k, v, np.exp(g), beta, rec, rows, inplace)
    for t, state in zip(rows, states):
        keep_state(store, where_state, (start, t, num), window[t + 1 : t + kernel], state)
    return out


def _decode(be, rows, meta: AttnMeta, weights, spec, where) -> np.ndarray:
    """A decode step (every sequence one row, none verifying a draft) in one backend call:
    each sequence's state before its row (its running state is updated in place, a snapshot
    copied first), `Backend.delta_net_decode`, then the states after the row kept as
    `_sequence` keeps them. -> `[n, value_dim]`."""
    store, layer = where
    states = []
    for table, ctx in zip(meta.block_tables, meta.context_lens):
        conv, rec = resume_state(store, layer, table, ctx - 1, copy=False)
        running = ctx == 1 or table[(ctx - 2) // store.block_size] not in store.snapshots
        states.append((conv, rec if running else rec.copy()))
    y, convs = be.delta_net_decode(rows, weights, spec, states)
    for table, ctx, conv, (_, rec) in zip(meta.block_tables, meta.context_lens, convs, states):
        keep_state(store, (layer, table, None), (ctx - 1, 0, 1), conv, rec)
    return y


def delta_rule_reference(q, k, v, decay, beta, state, rows) -> tuple[np.ndarray, list[np.ndarray]]:
    """The gated delta rule in numpy, one row at a time (`Backend.delta_rule`'s default):
    `S = decay S; kv = S^T k; S += k (beta (v - kv))^T; o = S^T q` per value head."""
    out = np.empty(v.shape, np.float32)
    wanted, kept = set(rows), []
    for t in range(v.shape[0]):
        state = state * decay[t][:, None, None]
        kv_mem = (state * k[t][:, :, None]).sum(axis=1)  # [Hv, dv]
        delta = (v[t] - kv_mem) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = (state * q[t][:, :, None]).sum(axis=1)
        if t in wanted:
            kept.append(state)
    return out, kept


def gate_heads(be: Backend, x: Tensor, num_heads: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """Split a gated attention's query projection `[n, h * 2 hd]` (per head: query, gate) into
    (q `[n, h * hd]`, gate `[n, h * hd]`)."""
    host = be.read(x).reshape(-1, num_heads, 2 * head_dim)
    n = host.shape[0]
    q = np.ascontiguousarray(host[..., :head_dim].reshape(n, -1))
    return be.upload(q), be.upload(np.ascontiguousarray(host[..., head_dim:].reshape(n, -1)))


def sigmoid_gate(be: Backend, x: Tensor, gate: Tensor) -> Tensor:
    """`x * sigmoid(gate)`, both `[n, m]` (the gated attention's output gate)."""
    return be.upload(be.read(x) * _sigmoid(be.read(gate)))
