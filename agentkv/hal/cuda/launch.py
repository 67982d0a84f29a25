"""Launch wrappers of the Triton kernels: output allocation, grids and tile sizes, and the
per-step tables attention reads (uploaded once per step, without a host sync)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import triton

from agentkv.hal.base import AttnMeta, Weight
from agentkv.hal.cuda import kernels
from agentkv.hal.portable.steps import padded_tables, to_device


class Tiles(NamedTuple):
    """Tile sizes: part of the identity, since another tile sums in another order. Never
    chosen by the row count (that is what would break row invariance)."""

    bm: int  # matmul rows per program (tl.dot needs >= 16)
    bn: int  # matmul output columns per program
    bk: int  # matmul K step
    keys: int  # attention keys per step inside a 256-key range (divides 256)
    norm: int  # rms_norm lanes


DEVICE_TILES = Tiles(16, 64, 64, 64, 1024)
# The interpreter runs each program in Python: wider tiles mean fewer programs, and CI time.
INTERPRETER_TILES = Tiles(16, 128, 128, 128, 1024)


def build_id(tiles: Tiles) -> str:
    """Digest of the kernel sources, the tiles and the Triton version."""
    h = hashlib.sha256(triton.__version__.encode())
    for name in ("kernels.py", "dequant.py"):
        h.update((Path(__file__).parent / name).read_bytes())
    h.update(repr(tuple(tiles)).encode())
    return f"triton-{triton.__version__}-{h.hexdigest()[:12]}"


def matmul(tiles: Tiles, x: torch.Tensor, weight: Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """`[m, k] @ weight[n, k].T (+ bias)` -> f32 `[m, n]`."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"cuda matmul: x has {k} columns but weight {weight.name!r} is {weight.shape}")
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    row_bytes = weight.raw.shape[1] if weight.qtype else 0
    grid = (triton.cdiv(m, tiles.bm), triton.cdiv(n, tiles.bn))
    kernels.matmul_kernel[grid](
        x, weight.raw, out if bias is None else bias, out, m, n, k, row_bytes,
        QTYPE=weight.qtype, HAS_BIAS=bias is not None, BM=tiles.bm, BN=tiles.bn, BK=tiles.bk,
    )  # fmt: skip
    return out


def embedding(tiles: Tiles, weight: Weight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` `[n]` of a gguf-rows table, dequantized -> f32 `[n, k]`."""
    k = weight.shape[1]
    out = torch.empty((ids.shape[0], k), dtype=torch.float32, device=ids.device)
    grid = (ids.shape[0], triton.cdiv(k, tiles.norm))
    kernels.embedding_kernel[grid](ids, weight.raw, out, k, weight.raw.shape[1], QTYPE=weight.qtype, BK=tiles.norm)
    return out


def rms_norm(tiles: Tiles, x: torch.Tensor, gain: torch.Tensor, eps: float, unit_offset: bool) -> torch.Tensor:
    """RMSNorm over the last dim of `[..., d]` (q/k norms pass `[n, h, hd]`)."""
    x = x.contiguous()
    d = x.shape[-1]
    out = torch.empty_like(x)
    block = min(tiles.norm, triton.next_power_of_2(d))
    kernels.rms_norm_kernel[(x.numel() // d,)](x, gain, out, d, eps, UNIT_OFFSET=unit_offset, BD=block)
    return out


def add_norm(tiles: Tiles, h, delta, gain, eps: float, unit_offset: bool, post_gain) -> tuple:
    """Backend.add_norm in one launch: (h + (rms_norm(delta, post_gain) if post_gain is not
    None else delta), rms_norm of that with `gain`), both f32 `[n, d]`."""
    h, delta = h.contiguous(), delta.contiguous()
    d = h.shape[-1]
    h_new, normed = torch.empty_like(h), torch.empty_like(h)
    block = min(tiles.norm, triton.next_power_of_2(d))
    post = post_gain is not None
    kernels.add_norm_kernel[(h.numel() // d,)](
        h, delta, gain, post_gain if post else gain, h_new, normed, d, eps,
        POST=post, UNIT_OFFSET=unit_offset, BD=block,
    )  # fmt: skip
    return h_new, normed


class StepTables(NamedTuple):
    tables: torch.Tensor  # int32 [num_seqs, width]: each sequence's block table, 0-padded
    row_seq: torch.Tensor  # int32 [n]: query row -> sequence
    positions: torch.Tensor  # int32 [n]
    width: int


_TABLES_MEMO: list = [(None, None)]  # (meta, StepTables): every layer of a step passes one meta


def step_tables(meta: AttnMeta, device: torch.device) -> StepTables:
    """The step's attention tables on `device`, built on the host and copied in one
    non-blocking upload, once per step."""
    last_meta, last = _TABLES_MEMO[0]
    if last_meta is meta and last.tables.device == device:
        return last
    padded = padded_tables(meta.block_tables)
    (num_seqs, width), n = padded.shape, len(meta.positions)
    host = np.zeros(num_seqs * width + 2 * n, np.int32)
    host[: num_seqs * width] = padded.reshape(-1)
    host[num_seqs * width : num_seqs * width + n] = np.repeat(np.arange(num_seqs), meta.query_lens)
    host[num_seqs * width + n :] = meta.positions
    packed = to_device(host, device)
    out = StepTables(
        packed[: num_seqs * width].view(num_seqs, width),
        packed[num_seqs * width : num_seqs * width + n],
        packed[num_seqs * width + n :],
        width,
    )
    _TABLES_MEMO[0] = (meta, out)
    return out


class Scores(NamedTuple):
    """How attention scores its keys: the scale, a window (None: all), a softcap (None: none)
    and each head's sink logit (f32 `[h]` on the device, or None)."""

    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None


def attention(tiles: Tiles, q: torch.Tensor, kv, layer: int, step: StepTables, scores: Scores) -> torch.Tensor:
    """Paged causal attention of q `[n, h, hd]` over the TorchKV store -> `[n, h, hd]`; a
    sink joins every row's denominator after its keys."""
    scale, window, softcap, sinks = scores
    q = q.contiguous()
    n, h, hd = q.shape
    spec = kv.spec
    out = torch.empty_like(q)
    if n == 0:
        return out
    no_window = 1 << 30  # past every position: lo = 0
    kernels.attention_kernel[(n, h)](
        q, kv.k_slots[layer], kv.v_slots[layer], out, step.tables, step.row_seq, step.positions,
        out if sinks is None else sinks, float(scale), int(window or no_window), float(softcap or 0.0), step.width,
        spec.block_size, H=h, KVH=spec.num_kv_heads, HD=hd, HDP=triton.next_power_of_2(hd), BN=tiles.keys,
        SOFTCAP=bool(softcap), SINKS=sinks is not None,
    )  # fmt: skip
    return out


class ExpertTiles(NamedTuple):
    """Where each grouped-matmul program works, built on the device from the routing (no host
    read): rows sorted by expert, expert e's rows at [row_start[e], row_end[e])."""

    tile_expert: torch.Tensor  # int64 [tiles]: the program's expert, E for an empty tile
    tile_row: torch.Tensor  # int64 [tiles]: its first sorted row
    row_end: torch.Tensor  # int64 [E]
    num_tiles: int  # cdiv(rows, bm) + E: at least the tiles the counts need, known on the host


def expert_tiles(tiles: Tiles, chosen_sorted: torch.Tensor, num_experts: int) -> ExpertTiles:
    """The tile tables of `chosen_sorted` (the experts of the sorted rows, ascending)."""
    device, bm = chosen_sorted.device, tiles.bm
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, chosen_sorted, torch.ones_like(chosen_sorted))  # bincount reads its max back
    row_end = torch.cumsum(counts, 0)
    per_expert = (counts + bm - 1) // bm
    tiles_end = torch.cumsum(per_expert, 0)
    num_tiles = triton.cdiv(chosen_sorted.shape[0], bm) + num_experts
    t = torch.arange(num_tiles, dtype=torch.int64, device=device)
    expert = torch.searchsorted(tiles_end, t, right=True)
    e = expert.clamp(max=num_experts - 1)
    tile_row = (row_end - counts)[e] + (t - (tiles_end - per_expert)[e]) * bm
    return ExpertTiles(expert, tile_row, row_end, num_tiles)


def grouped_matmul(tiles: Tiles, x: torch.Tensor, stacked: Weight, num_experts: int, where: ExpertTiles, bias=None):
    """Rows of `x` `[m, k]` (sorted by expert) times their expert's weight (+ its bias): `stacked`
    holds the experts' `[n, k]` weights back to back (`shape` `[E * n, k]`), `bias` f32 `[E, n]`
    or None -> f32 `[m, n]`."""
    x = x.contiguous()
    m, k = x.shape
    n = stacked.shape[0] // num_experts
    out = torch.empty((m, n), dtype=torch.float32, device=x.device)
    row_bytes = stacked.raw.shape[1] if stacked.qtype else 0
    kernels.grouped_matmul_kernel[(where.num_tiles, triton.cdiv(n, tiles.bn))](
        x, stacked.raw, out if bias is None else bias, out, where.tile_expert, where.tile_row, where.row_end,
        n, k, row_bytes, num_experts, QTYPE=stacked.qtype, HAS_BIAS=bias is not None, BM=tiles.bm, BN=tiles.bn,
        BK=tiles.bk,
    )  # fmt: skip
    return out
