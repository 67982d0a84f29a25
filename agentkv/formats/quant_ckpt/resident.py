"""Canonical quant tensors -> a resident layout the backends read, exactly, or f32 with a reason.

Mapped onto an existing GGUF block format only where every value stays bit-identical in f32:

    4-bit, zero 8 in every 32-column block, f16-exact scales   -> Q4_0  x = (q - 8) * d
    8-bit, zero 128 in every 32-column block, f16-exact scales -> Q8_0  x = (q - 128) * d

`(q - z) * s` with |q - z| < 256 and s an f16 value is exact in float32 (at most 19 significant
bits), so these blocks reproduce `GroupedInt.dequantize` bit for bit. Everything else keeps its
codes in agentkv's own group-32 blocks (agentkv.formats.quants.group32); a backend without a
kernel for them dequantizes that tensor to f32 at upload (and the load log says so). Only a
tensor whose groups do not fall on 32-column blocks is f32 here already, with the reason.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.quant_ckpt.unpack import GroupedFp8, GroupedInt
from agentkv.formats.quants.group32 import F8G32, I4G32, I8G32

BLOCK = 32
Q4_0, Q8_0, F32 = (int(GGMLQuantizationType.Q4_0), int(GGMLQuantizationType.Q8_0), int(GGMLQuantizationType.F32))


class Resident(NamedTuple):
    """A tensor ready for `Backend.upload_weight`: raw data in `qtype`, and why not quantized."""

    qtype: int
    data: np.ndarray  # uint8 [out, row_bytes] for block formats, float32 [out, in] for F32
    fallback: str | None = None  # the reason it is f32, None when it stays quantized


def _f16_exact(scale: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.all(scale.astype(np.float16).astype(np.float32) == scale))


def block_groups(group: np.ndarray) -> np.ndarray | None:
    """The group of each 32-column block, or None when a block spans two groups or the row
    is not whole blocks (an act-order g_idx usually does)."""
    if group.size % BLOCK:
        return None
    per_block = group.reshape(-1, BLOCK)
    if not np.all(per_block == per_block[:, :1]):
        return None
    return per_block[:, 0]


def _q4_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    qs = q.reshape(q.shape[0], -1, 2, 16)
    packed = qs[:, :, 0] | (qs[:, :, 1] << np.uint8(4))  # element i low nibble, i + 16 high
    head = np.ascontiguousarray(d, dtype=np.float16).view(np.uint8).reshape(q.shape[0], -1, 2)
    return np.concatenate([head, packed], axis=-1).reshape(q.shape[0], -1)


def _q8_0(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    qs = (q.astype(np.int16) - 128).astype(np.int8).view(np.uint8).reshape(q.shape[0], -1, BLOCK)
    head = np.ascontiguousarray(d, dtype=np.float16).view(np.uint8).reshape(q.shape[0], -1, 2)
    return np.concatenate([head, qs], axis=-1).reshape(q.shape[0], -1)


def repack_int(t: GroupedInt) -> Resident:
    """The exact resident form of integer codes (see the module docstring)."""
    groups = block_groups(t.group)
    if groups is None:
        return Resident(F32, t.dequantize(), "groups do not fall on whole 32-column blocks")
    scale, zero = t.scale[:, groups], t.zero[:, groups]
    mid = float(1 << (t.bits - 1))
    if np.all(zero == mid) and _f16_exact(scale):
        fmt, fn = (Q4_0, _q4_0) if t.bits == 4 else (Q8_0, _q8_0)
        return Resident(fmt, fn(t.q, scale))
    own = I4G32 if t.bits == 4 else I8G32
    return Resident(int(own.qtype), own.encode(t.q, scale, zero))


def repack_fp8(t: GroupedFp8) -> Resident:
    """FP8 codes with one float32 scale per 32-column block (a block grid repeats its scale)."""
    if t.codes.shape[1] % BLOCK or t.block[1] % BLOCK:
        return Resident(F32, t.dequantize(), "scale blocks do not fall on whole 32-column blocks")
    rows = np.arange(t.codes.shape[0]) // t.block[0]
    cols = np.arange(0, t.codes.shape[1], BLOCK) // t.block[1]
    return Resident(int(F8G32.qtype), F8G32.encode(t.codes, t.scale[rows][:, cols], None))
