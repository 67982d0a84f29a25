"""Stored quant tensors -> one canonical form per kind: integer codes with group scales and
zero points (`GroupedInt`), or FP8 codes with a scale grid (`GroupedFp8`).

The packing facts, per format (W is the logical `[out, in]` linear weight, b the bits,
p = 32 // b values per int32 word, bit slot j of a word holds bits [b*j, b*j + b)):

    gptq    qweight int32 [in / p, out]   q[r*p + j, o] = slot j of qweight[r, o]   (along in)
            qzeros  int32 [G, out / p]    z[g, c*p + j] = slot j of qzeros[g, c]    (+1 in v1)
            scales  f16   [G, out]        g_idx int32 [in] (group of each input column)
    awq     qweight int32 [in, out / 8]   column c*8 + ORDER[j] = slot j, ORDER = 0 2 4 6 1 3 5 7
            qzeros  int32 [G, out / 8]    same interleave; scales f16 [G, out]; group = i // gs
    pack-quantized (compressed-tensors)
            weight_packed int32 [out, ceil(in*b/32)]  element i at bit i*b, stored q + 2^(b-1)
            weight_zero_point int32 [ceil(out*b/32), G] packed along out, same offset
            weight_scale [out, G]; weight_g_idx int32 [in] with actorder "group"

Every family dequantizes as W[o, i] = scale[o, g(i)] * (q[o, i] - zero[o, g(i)]); here q and
zero are the unsigned codes (the signed offsets of pack-quantized cancel in q - zero).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from agentkv.formats.errors import FormatError
from agentkv.formats.quants.group32 import E4M3_TABLE

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # slot j of an AWQ word holds column AWQ_ORDER[j] of its 8


class QuantTensorError(FormatError):
    """Quant component tensors whose shapes or values contradict each other or the scheme."""


class GroupedInt(NamedTuple):
    """W[o, i] = scale[o, group[i]] * (q[o, i] - zero[o, group[i]]), evaluated in float32."""

    q: np.ndarray  # uint8 [out, in]: unsigned codes 0 .. 2^bits - 1
    scale: np.ndarray  # float32 [out, G]: the stored scales, widened exactly
    zero: np.ndarray  # float32 [out, G]: unsigned zero codes (2^(bits-1) when symmetric)
    group: np.ndarray  # int64 [in]: each input column's group
    bits: int

    def dequantize(self) -> np.ndarray:
        """float32 [out, in], one rounding per element (the product)."""
        return self.scale[:, self.group] * (self.q.astype(np.float32) - self.zero[:, self.group])


class GroupedFp8(NamedTuple):
    """W[o, i] = e4m3(codes[o, i]) * scale[o // block[0], i // block[1]], in float32."""

    codes: np.ndarray  # uint8 [out, in]: float8 e4m3fn bit patterns
    scale: np.ndarray  # float32 [ceil(out / block[0]), ceil(in / block[1])]
    block: tuple[int, int]

    def dequantize(self) -> np.ndarray:
        rows = np.arange(self.codes.shape[0]) // self.block[0]
        cols = np.arange(self.codes.shape[1]) // self.block[1]
        return E4M3_TABLE[self.codes] * self.scale[rows][:, cols]


def unpack_slots(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 [..., n] -> uint8 [..., n, 32 // bits]: slot j = bits [b*j, b*j + b) of each word."""
    u = np.ascontiguousarray(words).view(np.uint32)
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    return ((u[..., None] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.uint8)


def _need(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if tuple(array.shape) != shape:
        raise QuantTensorError(f"{name}: shape {list(array.shape)}, expected {list(shape)}")


def _groups(num_in: int, group_size: int | None, g_idx: np.ndarray | None, num_groups: int, name: str) -> np.ndarray:
    if g_idx is None:
        return np.arange(num_in) // (group_size or num_in)
    group = np.asarray(g_idx, dtype=np.int64).reshape(-1)
    _need(f"{name}.g_idx", group, (num_in,))
    if group.min(initial=0) < 0 or group.max(initial=0) >= num_groups:
        raise QuantTensorError(
            f"{name}.g_idx: values must lie in [0, {num_groups}), got [{group.min()}, {group.max()}]"
        )
    return group


def _num_groups(num_in: int, group_size: int | None) -> int:
    return -(-num_in // group_size) if group_size else 1


def unpack_gptq(
    name: str, qweight, qzeros, scales, g_idx, bits: int, group_size: int | None, zero_plus_one: bool
) -> GroupedInt:
    """GPTQ (AutoGPTQ / gptqmodel layout); `zero_plus_one` for the v1 checkpoint format."""
    p = 32 // bits
    num_in, num_out = qweight.shape[0] * p, qweight.shape[1]
    groups = scales.shape[0]
    _need(f"{name}.scales", scales, (groups, num_out))
    _need(f"{name}.qzeros", qzeros, (groups, num_out // p))
    if g_idx is None and groups != _num_groups(num_in, group_size):
        raise QuantTensorError(
            f"{name}.scales: {groups} groups, group_size {group_size} over {num_in} "
            f"inputs gives {_num_groups(num_in, group_size)}"
        )
    q = unpack_slots(qweight, bits).transpose(0, 2, 1).reshape(num_in, num_out).T
    zero = unpack_slots(qzeros, bits).reshape(groups, num_out).astype(np.float32)
    if zero_plus_one:
        zero += np.float32(1)  # v1 stores zero - 1; AutoGPTQ adds the 1 back after unpacking
    return GroupedInt(
        np.ascontiguousarray(q),
        np.ascontiguousarray(scales.astype(np.float32).T),
        np.ascontiguousarray(zero.T),
        _groups(num_in, group_size, g_idx, groups, name),
        bits,
    )


def _awq_columns(words: np.ndarray) -> np.ndarray:
    """int32 [r, out / 8] -> uint8 [r, out] undoing the interleave."""
    slots = unpack_slots(words, 4)  # [r, out/8, 8]: slot j = column AWQ_ORDER[j]
    cols = np.empty_like(slots)
    cols[..., list(AWQ_ORDER)] = slots
    return cols.reshape(words.shape[0], -1)


def unpack_awq(name: str, qweight, qzeros, scales, group_size: int | None) -> GroupedInt:
    """AWQ GEMM (4-bit, zero points, the 0 2 4 6 1 3 5 7 interleave)."""
    num_in, num_out = qweight.shape[0], qweight.shape[1] * 8
    groups = _num_groups(num_in, group_size)
    _need(f"{name}.scales", scales, (groups, num_out))
    _need(f"{name}.qzeros", qzeros, (groups, num_out // 8))
    q = _awq_columns(qweight).T
    zero = _awq_columns(qzeros).astype(np.float32)
    return GroupedInt(
        np.ascontiguousarray(q),
        np.ascontiguousarray(scales.astype(np.float32).T),
        np.ascontiguousarray(zero.T),
        _groups(num_in, group_size, None, groups, name),
        4,
    )


def unpack_sequential(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """compressed-tensors' dense packing along the last axis: int32 [r, w] -> uint8 [r, count]."""
    return unpack_slots(words, bits).reshape(words.shape[0], -1)[:, :count]


def unpack_pack_quantized(
    name: str, packed, scale, zero_point, shape, g_idx, bits: int, group_size: int | None
) -> GroupedInt:
    """compressed-tensors pack-quantized; `zero_point` None when symmetric."""
    num_out, num_in = (int(d) for d in np.asarray(shape).reshape(-1))
    groups = scale.shape[1] if scale.ndim == 2 else 1
    _need(f"{name}.weight_scale", scale.reshape(num_out, -1), (num_out, groups))
    _need(f"{name}.weight_packed", packed, (num_out, -(-num_in * bits // 32)))
    q = unpack_sequential(packed, bits, num_in)
    if zero_point is None:
        zero = np.full((num_out, groups), 1 << (bits - 1), np.float32)
    else:
        _need(f"{name}.weight_zero_point", zero_point, (-(-num_out * bits // 32), groups))
        zero = unpack_sequential(np.ascontiguousarray(zero_point.T), bits, num_out).T.astype(np.float32)
    group = _groups(num_in, group_size, g_idx, groups, name)
    return GroupedInt(
        q,
        np.ascontiguousarray(scale.reshape(num_out, groups).astype(np.float32)),
        np.ascontiguousarray(zero),
        group,
        bits,
    )


def unpack_fp8(name: str, codes, scale, block: tuple[int, int] | None) -> GroupedFp8:
    """FP8 e4m3 codes with a per-tensor ([1] or []), per-row ([out, 1]) or block scale grid."""
    num_out, num_in = codes.shape
    grid = np.asarray(scale, dtype=np.float32)
    grid = grid.reshape(1, 1) if grid.size == 1 else grid.reshape(grid.shape[0], -1)
    if block is None:
        block = (-(-num_out // grid.shape[0]), -(-num_in // grid.shape[1]))
    _need(f"{name} scale grid", grid, (-(-num_out // block[0]), -(-num_in // block[1])))
    return GroupedFp8(np.ascontiguousarray(codes).view(np.uint8), np.ascontiguousarray(grid), block)
