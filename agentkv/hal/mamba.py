"""The Mamba-2 mixer of hybrid models (Granite-4.0-H): causal depthwise conv with its rolling
state, the selective state-space recurrence (SSD) one token at a time, the D skip and the
grouped gated RMSNorm, over the state slots of `hal.recurrent.StateStore`.

    in_proj row:  | z: inner | x: inner | B: groups * state | C: groups * state | dt: heads |
                             '------------ conv (K taps, + bias), silu ------------'

Per token t and head h (group g = h // (heads / groups)), with dt = softplus(dt_t + dt_bias)
clamped to the time-step limit and A = -exp(A_log):

    S_h <- S_h * exp(dt_h A_h) + (dt_h B_g) x_h^T      S_h: [head_dim, state]
    y_h  = S_h C_g + D_h x_h

then y * silu(z), RMS-normed per group of inner / groups channels, times the gain.

Exactness: as for the DeltaNet (`hal/recurrent.py`), every token's arithmetic runs on arrays
of fixed shapes in one order, so the state after position p has the same bits however the
prompt was split, batched or resumed; every backend runs this numpy code on host copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, Tensor
from agentkv.hal.state_store import StateStore, keep_state, resume_state


@dataclass(frozen=True, slots=True)
class Mamba2Spec:
    """Shapes of one Mamba-2 layer: `num_heads` x `head_dim` channels (inner), `num_groups`
    groups of B/C of `state_size` each, a `conv_kernel`-tap conv, the gated norm's `eps`, and
    the time-step clamp `dt_min`, `dt_max` (HF `time_step_limit`, (0, inf) by default)."""

    num_heads: int
    head_dim: int
    num_groups: int
    state_size: int
    conv_kernel: int
    eps: float
    dt_min: float = 0.0
    dt_max: float = math.inf

    def __post_init__(self):
        for name in ("num_heads", "head_dim", "num_groups", "state_size", "conv_kernel"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Mamba2Spec.{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_groups:
            raise ValueError(
                f"Mamba2Spec.num_heads={self.num_heads} must be a multiple of num_groups={self.num_groups}"
            )
        if not 0.0 <= self.dt_min <= self.dt_max:
            raise ValueError(f"Mamba2Spec time-step limit ({self.dt_min}, {self.dt_max}) must be 0 <= min <= max")

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.num_groups * self.state_size

    @property
    def in_proj_dim(self) -> int:
        """Columns of the input projection: z | x | B | C | dt."""
        return self.inner + self.conv_dim + self.num_heads

    @property
    def conv_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_dim)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.state_size)

    @property
    def state_bytes(self) -> int:
        """Conv state plus SSM state of one slot, f32."""
        return 4 * (int(np.prod(self.conv_shape)) + int(np.prod(self.recurrent_shape)))


@dataclass(frozen=True, slots=True)
class Mamba2Weights:
    """Host f32 arrays of one layer's small parameters: the depthwise conv `[conv_dim, kernel]`
    and its bias `[conv_dim]` (or None), `a_neg` = -exp(A_log), `dt_bias`, the skip `d` (each
    `[num_heads]`) and the gated norm's gain `[inner]`."""

    conv: np.ndarray
    conv_bias: np.ndarray | None
    a_neg: np.ndarray
    dt_bias: np.ndarray
    d: np.ndarray
    norm: np.ndarray


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20)."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return (x / (np.float32(1) + np.exp(-x))).astype(np.float32)


def mamba2(
    be: Backend,
    projected: Tensor,
    weights: Mamba2Weights,
    spec: Mamba2Spec,
    store: StateStore,
    layer: int,
    meta: AttnMeta,
) -> Tensor:
    """The Mamba-2 mixer between the input projection `projected` `[n, in_proj_dim]` (module
    docstring) and the output projection. Reads and writes the sequences' state slots in
    `store` layer `layer` (mutates). -> `[n, inner]`."""
    host = be.read(projected)
    if host.shape[-1] != spec.in_proj_dim:
        raise ValueError(f"mamba2: in_proj gives {host.shape[-1]} columns, expected {spec.in_proj_dim}")
    z, xbc, dt = np.split(host, [spec.inner, spec.inner + spec.conv_dim], axis=1)
    dt = np.clip(_softplus(dt + weights.dt_bias), np.float32(spec.dt_min), np.float32(spec.dt_max))
    y = np.empty((host.shape[0], spec.num_heads, spec.head_dim), np.float32)
    spans = zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables)
    for i, (start_row, num, ctx, table) in enumerate(spans):
        rows = slice(start_row, start_row + num)
        y[rows] = _sequence((xbc[rows], dt[rows]), ctx - num, (table, i), weights, spec, store, layer)
    gated = y.reshape(y.shape[0], spec.num_groups, -1) * _silu(z).reshape(y.shape[0], spec.num_groups, -1)
    normed = gated * (np.float32(1) / np.sqrt((gated * gated).mean(-1, keepdims=True) + np.float32(spec.eps)))
    out = weights.norm * normed.reshape(y.shape[0], spec.inner)
    return be.upload(np.ascontiguousarray(out, np.float32))


def _conv(xbc: np.ndarray, conv_state: np.ndarray, weights: Mamba2Weights, kernel: int) -> tuple[np.ndarray, ...]:
    """(silu(conv) `[num, conv_dim]`, the window `[K - 1 + num, conv_dim]` it read)."""
    num = xbc.shape[0]
    window = np.concatenate([conv_state, xbc], axis=0)
    conv = window[0:num] * weights.conv[:, 0]
    for tap in range(1, kernel):  # taps summed in one fixed order, then the bias
        conv = conv + window[tap : tap + num] * weights.conv[:, tap]
    if weights.conv_bias is not None:
        conv = conv + weights.conv_bias
    return _silu(conv), window


def _sequence(rows, start, where, weights, spec, store, layer) -> np.ndarray:
    """One sequence's rows `(xbc, dt)` at positions [start, start + len(xbc)) (`where`: its
    block table and chunk index): returns y `[len, heads, head_dim]` (with the D skip) and
    leaves the state after each block end it passes, and after its last row, in the slot of
    that position's block; a verification chunk also records the state after every row."""
    xbc, dt = rows
    table, index = where
    conv_state, ssm = resume_state(store, layer, table, start)
    conv, window = _conv(xbc, conv_state, weights, spec.conv_kernel)
    num, h, p, n = xbc.shape[0], spec.num_heads, spec.head_dim, spec.state_size
    gn = spec.num_groups * n
    x = conv[:, : spec.inner].reshape(num, h, p)
    per_group = h // spec.num_groups  # head j reads group j // per_group
    b = conv[:, spec.inner : spec.inner + gn].reshape(num, spec.num_groups, n).repeat(per_group, axis=1)
    c = conv[:, spec.inner + gn :].reshape(num, spec.num_groups, n).repeat(per_group, axis=1)
    decay = np.exp(dt * weights.a_neg)  # [num, h]
    db = dt[:, :, None] * b  # [num, h, n]
    skip = weights.d[:, None] * x
    where_state = (layer, table, store.recording.get(index))
    y = np.empty((num, h, p), np.float32)
    for t in range(num):
        ssm = ssm * decay[t][:, None, None] + db[t][:, None, :] * x[t][:, :, None]
        y[t] = (ssm * c[t][:, None, :]).sum(-1) + skip[t]
        keep_state(store, where_state, (start, t, num), window[t + 1 : t + spec.conv_kernel], ssm)
    return y
