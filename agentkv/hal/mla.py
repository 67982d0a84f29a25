"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, Moonlight) in its absorbed form, composed
of backend ops, for every row alike (prefill and decode).

Each token stores ONE vector per layer in a latent KV layout (`KVSpec.latent`):

    stored row:  | c: kv_lora_rank (kv_a_layernorm'd latent) | k_rope: qk_rope_head_dim (roped) |

Per head, the key of token t is `[W_UK c_t, k_rope_t]` and its value `W_UV c_t`. Folding W_UK into
the query and W_UV after the attention leaves one multi-query attention over the stored rows:

    q_abs[h] = | W_UK[h]^T q_nope[h] : kv_lora_rank | rope(q_rope[h]) : qk_rope_head_dim |
    score    = q_abs[h] . stored_t * scale                 (= q[h] . k[h]_t of the expanded form)
    out[h]   = W_UV[h] (softmax(score) @ stored[:, :kv_lora_rank])

The attention op reads the stored rows as K and V alike (one kv head), and the value's rope
columns are dropped after it. Decode and prefill run this one form, so a row's bits do not
depend on how the prompt was split; every op below is row-invariant on its own (the matmuls per
head are the backend's, the joins are copies). The expanded form (`kv_b` applied to every
cached latent) would give other bits and is never used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, RopeSpec, Tensor, Weight


@dataclass(frozen=True, slots=True)
class MLASpec:
    """One layer's latent attention: heads, the per-head dims, the latent width, the rope of
    the `rope_dim` shared key and query columns, the score scale (with DeepSeek's YaRN mscale
    folded in) and the RMSNorm eps of the q/kv latents."""

    num_heads: int
    nope_dim: int  # qk_nope_head_dim
    rope_dim: int  # qk_rope_head_dim
    v_dim: int  # v_head_dim
    kv_rank: int  # kv_lora_rank
    rope: RopeSpec
    scale: float
    eps: float = 1e-6

    def __post_init__(self):
        for name in ("num_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MLASpec.{name} must be > 0, got {getattr(self, name)}")
        if self.rope.dim != self.rope_dim:
            raise ValueError(f"MLASpec.rope.dim={self.rope.dim} must equal rope_dim={self.rope_dim}")

    @property
    def latent_dim(self) -> int:
        """Width of the stored row: the latent and the rope key."""
        return self.kv_rank + self.rope_dim

    @property
    def unit_offset(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class MLAWeights:
    """One layer's latent attention weights. `norm` is the block's input RMSNorm. The query is
    `q` `[h * (nope + rope), d]`, or low-rank: `q_a` `[q_rank, d]`, `q_a_norm`, `q_b`. `kv_a`
    `[kv_rank + rope, d]` (kv_a_proj_with_mqa), `kv_a_norm` `[kv_rank]`; `uk[h]` `[kv_rank, nope]`
    (head h's W_UK, transposed) and `uv[h]` `[v_dim, kv_rank]` split from kv_b (or a GGUF's
    attn_k_b / attn_v_b); `o` `[d, h * v_dim]`."""

    norm: Weight
    kv_a: Weight
    kv_a_norm: Weight
    uk: tuple[Weight, ...]
    uv: tuple[Weight, ...]
    o: Weight
    q: Weight | None = None
    q_a: Weight | None = None
    q_a_norm: Weight | None = None
    q_b: Weight | None = None
    kv_a_bias: Weight | None = None

    def __post_init__(self):
        if (self.q is None) == (self.q_b is None):
            raise ValueError("MLAWeights: give the query as q, or as q_a + q_a_norm + q_b (not both)")
        if len(self.uk) != len(self.uv) or not self.uk:
            raise ValueError(f"MLAWeights: {len(self.uk)} W_UK and {len(self.uv)} W_UV heads")


def concat(backend: Backend, parts: list[Tensor]) -> Tensor:
    """Join `[n, w_i]` tensors along the last dim (a copy, no arithmetic) for the numpy
    (reference) and torch (torch, cpu) backends."""
    raws = [p.raw for p in parts]
    if isinstance(raws[0], np.ndarray):
        return Tensor(np.concatenate(raws, axis=-1))
    import torch

    return Tensor(torch.cat(raws, dim=-1))


def mla_attention(be: Backend, x: Tensor, w: MLAWeights, spec: MLASpec, meta: AttnMeta, kv: Any, layer: int) -> Tensor:
    """Latent attention of the normed input `x` `[n, d]`: stores this step's latent rows into
    `kv` (a latent store; mutates it) and returns the o-projected output `[n, d]`."""
    q_abs = absorbed_query(be, x, w, spec, meta)  # [n, h, kv_rank + rope]
    row = be.reshape(latent_row(be, x, w, spec, meta), (x.shape[0], 1, spec.latent_dim))
    be.kv_store(kv, layer, row, row, meta.slot_mapping)
    return output(be, be.attention(q_abs, kv, layer, meta, spec.scale), w, spec)


def latent_row(be: Backend, x: Tensor, w: MLAWeights, spec: MLASpec, meta: AttnMeta) -> Tensor:
    """`[n, kv_rank + rope]`: each row's normed latent and its roped shared key."""
    n = x.shape[0]
    c, k_rope = be.split(be.matmul(x, w.kv_a, w.kv_a_bias), [spec.kv_rank, spec.rope_dim])
    c = be.rms_norm(c, w.kv_a_norm, spec.eps)
    k_rope = be.rope(be.reshape(k_rope, (n, 1, spec.rope_dim)), meta.positions, spec.rope)
    return concat(be, [c, be.reshape(k_rope, (n, spec.rope_dim))])


def output(be: Backend, out: Tensor, w: MLAWeights, spec: MLASpec) -> Tensor:
    """The attention's latent outputs `[n, h, width >= kv_rank]` through each head's W_UV
    (columns past kv_rank dropped), joined, through o -> `[n, d]`."""
    values = per_head(be, heads_apart(out.raw, 0, spec.kv_rank), w.uv)  # [n, v_dim] each
    return be.matmul(concat(be, values), w.o)


def q_residual(be: Backend, x: Tensor, w: MLAWeights, spec: MLASpec) -> Tensor:
    """The low-rank query's normed latent `q_a_norm(q_a x)` `[n, q_rank]`."""
    return be.rms_norm(be.matmul(x, w.q_a), w.q_a_norm, spec.eps)


def absorbed_query(
    be: Backend, x: Tensor, w: MLAWeights, spec: MLASpec, meta: AttnMeta, q_resid: Tensor | None = None
) -> Tensor:
    """`[n, h, kv_rank + rope]`: per head, q_nope through W_UK^T, then the roped q_rope."""
    n, h = x.shape[0], spec.num_heads
    if w.q is not None:
        q = be.matmul(x, w.q)
    else:
        q = be.matmul(q_resid if q_resid is not None else q_residual(be, x, w, spec), w.q_b)
    q3 = be.reshape(q, (n, h, spec.nope_dim + spec.rope_dim)).raw
    q_rope = be.rope(Tensor(_contiguous(q3[:, :, spec.nope_dim :])), meta.positions, spec.rope)  # [n, h, rope]
    q_latent = per_head(be, heads_apart(q3, 0, spec.nope_dim), w.uk)  # [n, kv_rank] each
    return join_heads(q_latent, q_rope.raw)


def heads_apart(raw: Any, lo: int, hi: int) -> list[Tensor]:
    """Columns `lo:hi` of each head of `[n, h, width]` as h contiguous `[n, hi - lo]` tensors,
    in one copy (numpy or torch; no arithmetic)."""
    if isinstance(raw, np.ndarray):
        return [Tensor(a) for a in np.ascontiguousarray(raw[:, :, lo:hi].transpose(1, 0, 2))]
    return [Tensor(a) for a in raw[:, :, lo:hi].transpose(0, 1).contiguous().unbind(0)]


def join_heads(latent: list[Tensor], rope: Any) -> Tensor:
    """`[n, h, kv_rank + rope]`: each head's latent query `[n, kv_rank]`, then its rope part
    from `rope` `[n, h, rope_dim]` (copies, no arithmetic)."""
    raws = [t.raw for t in latent]
    if isinstance(rope, np.ndarray):
        return Tensor(np.concatenate([np.stack(raws, axis=1), rope], axis=-1))
    import torch

    return Tensor(torch.cat([torch.stack(raws, dim=1), rope], dim=-1))


def _contiguous(raw: Any) -> Any:
    return np.ascontiguousarray(raw) if isinstance(raw, np.ndarray) else raw.contiguous()


def per_head(be: Backend, xs: list[Tensor], ws: tuple[Weight, ...]) -> list[Tensor]:
    """`xs[i] @ ws[i]` for every head: the backend's own grouped call where it has one (`cpu`:
    one kernel call, each product with one matmul's bits), else one matmul per head."""
    grouped = getattr(be, "head_matmuls", None)
    out = grouped(xs, ws) if grouped is not None else None
    return out if out is not None else [be.matmul(x, w) for x, w in zip(xs, ws)]


def kv_b_heads(kv_b: np.ndarray, spec: MLASpec) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split kv_b `[h * (nope + v), kv_rank]` (f32) into per-head W_UK^T `[kv_rank, nope]` and
    W_UV `[v, kv_rank]`, both C-contiguous."""
    per_head = kv_b.reshape(spec.num_heads, spec.nope_dim + spec.v_dim, spec.kv_rank)
    uk = [np.ascontiguousarray(per_head[i, : spec.nope_dim].T) for i in range(spec.num_heads)]
    uv = [np.ascontiguousarray(per_head[i, spec.nope_dim :]) for i in range(spec.num_heads)]
    return uk, uv
