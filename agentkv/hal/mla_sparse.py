"""DeepSeek sparse attention (DeepSeek-V3.2 `deepseek_v32`): a light indexer picks each query's
top-k keys, and the latent attention (hal/mla.py) runs over those keys alone.

The indexer's key is cached beside the latent, in the same row of the latent KV layout:

    stored row:  | c: kv_lora_rank | k_rope: qk_rope_head_dim | k_index: index_head_dim |

For query row r at position p, over the keys t = 0..p of its sequence:

    index[t] = sum_h  w[r, h] * relu(q_index[r, h] . k_index[t] * index_head_dim^-0.5)
    chosen   = the top_k positions by falling index, the lower position first on a tie
               (every key while p < top_k), then sorted by position
    out[h]   = softmax(q_abs[h] . [c, k_rope]_t * scale, t in chosen) @ c_t

with `w = weights_proj(x) * index_n_heads^-0.5`. Each row is computed alone, in one fixed order,
so a row's bits do not depend on the batch, the split or the chunk: `Backend.sparse_latent_attention`,
by default `attend_sparse` here (numpy on the host: its keys' gather, one GEMM per row whose shape
depends only on its own context; the torch backends' tensors read as numpy views of the same
memory), on the cpu backend the compiled kernel (kernels/sparse_mla.cpp: the same rule, its own
fixed arithmetic order, rows split across threads). transformers is the oracle of both; the
kernel's chosen keys and outputs are tested against `attend_sparse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.hal.base import AttnMeta, Backend, RopeSpec, Tensor, Weight
from agentkv.hal.mla import MLASpec, MLAWeights, absorbed_query, concat, latent_row, output, q_residual


@dataclass(frozen=True, slots=True)
class IndexerSpec:
    """The indexer's heads, head dim, top-k and its rope (neox, on the first rope dims)."""

    num_heads: int
    head_dim: int
    top_k: int
    rope: RopeSpec
    eps: float = 1e-6  # its key's LayerNorm

    def __post_init__(self):
        for name in ("num_heads", "head_dim", "top_k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"IndexerSpec.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class IndexerWeights:
    """`wq_b` `[H * D, q_rank]` (reads the query's normed latent), `wk` `[D, d]`, the key's
    LayerNorm `k_norm` / `k_norm_bias` `[D]`, `weights_proj` `[H, d]`."""

    wq_b: Weight
    wk: Weight
    k_norm: Weight
    k_norm_bias: Weight
    weights_proj: Weight


def sparse_mla_attention(
    be: Backend, x: Tensor, w: MLAWeights, spec: MLASpec, idx: tuple[IndexerWeights, IndexerSpec], meta: AttnMeta,
    kv: Any, layer: int,
) -> Tensor:  # fmt: skip
    """Sparse latent attention of the normed input `x` `[n, d]`: stores each row's latent and
    index key (mutates kv) and returns the o-projected output `[n, d]`."""
    iw, ispec = idx
    n, dim = x.shape[0], ispec.head_dim
    q_resid = q_residual(be, x, w, spec)
    q_abs = absorbed_query(be, x, w, spec, meta, q_resid)  # [n, h, kv_rank + rope]
    k_index = be.layer_norm(be.matmul(x, iw.wk), iw.k_norm, iw.k_norm_bias, ispec.eps)
    k_index = be.reshape(be.rope(be.reshape(k_index, (n, 1, dim)), meta.positions, ispec.rope), (n, dim))
    row = concat(be, [latent_row(be, x, w, spec, meta), k_index])
    row = be.reshape(row, (n, 1, row.shape[-1]))
    be.kv_store(kv, layer, row, row, meta.slot_mapping)
    q_index = be.rope(be.reshape(be.matmul(q_resid, iw.wq_b), (n, ispec.num_heads, dim)), meta.positions, ispec.rope)
    head_w = be.scale(be.matmul(x, iw.weights_proj), ispec.num_heads**-0.5)  # [n, H]
    out = be.sparse_latent_attention(q_abs, q_index, head_w, kv, layer, meta, spec, ispec)  # [n, h, kv_rank]
    return output(be, be.upload(out), w, spec)


def attend_sparse(
    q_abs: np.ndarray, q_index: np.ndarray, head_w: np.ndarray, store: np.ndarray, meta: AttnMeta, spec: MLASpec,
    ispec: IndexerSpec,
) -> np.ndarray:  # fmt: skip
    """The module docstring's rows: q_abs `[n, h, kv_rank + rope]`, q_index `[n, H, D]`,
    head_w `[n, H]`, store `[num_blocks, block_size, 1, row]` -> `[n, h, kv_rank]` f32."""
    n, h = q_abs.shape[0], spec.num_heads
    out = np.empty((n, h, spec.kv_rank), np.float32)
    scale, index_scale = np.float32(spec.scale), np.float32(ispec.head_dim**-0.5)
    for start, qlen, ctx, table in zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables):
        rows = store[np.asarray(table, dtype=np.int64)].reshape(-1, store.shape[-1])[:ctx].astype(np.float32)
        latent = np.ascontiguousarray(rows[:, : spec.latent_dim])
        index_keys = np.ascontiguousarray(rows[:, spec.latent_dim :].T)  # [D, ctx]
        for r in range(start, start + qlen):
            pos = int(meta.positions[r])
            chosen = choose_keys(q_index[r], head_w[r], index_keys[:, : pos + 1], index_scale, ispec.top_k)
            keys = latent[chosen]  # [k, kv_rank + rope], in position order
            scores = np.matmul(q_abs[r], np.ascontiguousarray(keys.T)) * scale  # [h, k]
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True, dtype=np.float32)
            out[r] = np.matmul(probs, np.ascontiguousarray(keys[:, : spec.kv_rank]))
    return out


def choose_keys(q_index: np.ndarray, head_w: np.ndarray, keys: np.ndarray, scale: np.float32, top_k: int) -> np.ndarray:
    """One query's chosen key positions, ascending: q_index `[H, D]`, head_w `[H]`, keys `[D, L]`."""
    length = keys.shape[1]
    if length <= top_k:
        return np.arange(length)
    scores = np.maximum(np.matmul(q_index, np.ascontiguousarray(keys)) * scale, np.float32(0.0))  # [H, L]
    index = np.matmul(head_w[None, :], scores)[0]  # [L]
    return np.sort(np.argsort(-index, kind="stable")[:top_k])


def host_array(t: Tensor) -> np.ndarray:
    """A numpy view (torch CPU tensors share memory; a device tensor is copied) or the array."""
    raw = t.raw
    return raw if isinstance(raw, np.ndarray) else raw.detach().contiguous().cpu().numpy()


def latent_store(kv: Any, layer: int) -> np.ndarray:
    """The layer's latent store `[num_blocks, block_size, 1, row]` as numpy (f16 or f32)."""
    return kv.k[layer] if isinstance(kv.k, np.ndarray) else kv.k_blocks[layer].cpu().numpy()
