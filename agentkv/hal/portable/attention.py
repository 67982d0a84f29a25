"""The `torch` backend's attention (no compiled kernels): fixed-shape tiles, so a query's
bits are the same in decode and in any prefill chunk (MKL's GEMM is row-invariant only for
fixed shapes)."""

from __future__ import annotations

import numpy as np
import torch

from agentkv.hal.base import AttnMeta
from agentkv.hal.portable.steps import to_device

GROUP = 16  # attention query tile: positions [16j, 16j + 16) share one fixed-shape tile


def paged_attention_portable(
    q: torch.Tensor, kv, layer: int, meta: AttnMeta, scale: float, window: int | None, softcap: float | None, sinks=None
) -> torch.Tensor:
    """Backend.attention for a TorchKV store `kv`, one tile per 16-aligned group of positions;
    `sinks` `[h]` (or None): per-head logits in the softmax denominator (gpt-oss)."""
    out = torch.empty_like(q)
    for start, qlen, ctx, table in zip(meta.query_starts, meta.query_lens, meta.context_lens, meta.block_tables):
        pos0 = ctx - qlen
        r = 0
        while r < qlen:
            group = (pos0 + r) // GROUP
            take = min(qlen - r, (group + 1) * GROUP - (pos0 + r))
            rows = slice(start + r, start + r + take)
            out[rows] = _attend_group(q[rows], (kv, layer, table), pos0 + r, scale, window, softcap, sinks)
            r += take
    return out


def _attend_group(
    q: torch.Tensor, where: tuple, first_pos: int, scale: float, window: int | None, softcap: float | None, sinks=None
) -> torch.Tensor:
    """Queries at positions [first_pos, first_pos + m) inside group g = first_pos // 16, the
    positions [16g, 16g + 16).

    Every such query is computed in a tile of exactly 16 rows at row `pos % 16` against keys
    [0, 16g + 16), so its shapes (and so its bits) are the same in decode and in any prefill
    chunk. Keys past a query's position are masked to -inf; their V rows get weight 0.
    `where` is (the TorchKV store, the layer, the sequence's block table)."""
    kv, layer, table = where
    m, h, hd = q.shape
    kvh, bs = kv.spec.num_kv_heads, kv.spec.block_size
    group = first_pos // GROUP
    num_keys = (group + 1) * GROUP
    slots = _slots(table, num_keys, bs, q.device)
    keys = kv.k[layer].index_select(0, slots).float()  # [L, kvh, hd]; an f16 store widened exactly
    vals = kv.v[layer].index_select(0, slots).float()
    off = first_pos - group * GROUP
    tile = q.new_zeros(GROUP, h, hd)
    tile[off : off + m] = q
    g = h // kvh
    qt = tile.reshape(GROUP, kvh, g, hd).permute(1, 2, 0, 3).reshape(kvh, g * GROUP, hd)
    scores = torch.matmul(qt, keys.permute(1, 2, 0)) * scale  # [kvh, g*16, L]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    qpos = torch.arange(group * GROUP, num_keys, device=q.device).repeat(g)  # row -> position
    kpos = torch.arange(num_keys, device=q.device)
    mask = kpos[None, :] > qpos[:, None]
    if window:
        mask |= kpos[None, :] <= qpos[:, None] - window
    scores = scores.masked_fill(mask[None], float("-inf"))
    if sinks is not None:  # one more column per head, dropped after the softmax: same shape every call
        sink = sinks.reshape(kvh, g, 1, 1).expand(kvh, g, GROUP, 1).reshape(kvh, g * GROUP, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vals.permute(1, 0, 2))  # [kvh, g*16, hd]
    out = out.reshape(kvh, g, GROUP, hd).permute(2, 0, 1, 3).reshape(GROUP, h, hd)
    return out[off : off + m]


def _slots(table, num_keys: int, bs: int, device) -> torch.Tensor:
    pos = np.arange(num_keys)
    blocks = np.asarray(table, dtype=np.int64)
    nb = min(len(blocks), -(-num_keys // bs))
    pos = pos[: nb * bs]
    slots = blocks[pos // bs] * bs + pos % bs
    if len(slots) < num_keys:  # keys past the last block: any valid slot, they are masked
        slots = np.concatenate([slots, np.full(num_keys - len(slots), slots[-1])])
    return to_device(slots, device)
