"""K-quant codecs (256-element super-blocks): decode Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Each super-block has float16 super-scales (d, and dmin where there is an offset) and small
per-sub-block integer scales; an element is `(d * sc) * q - (dmin * m)` or `(d * sc) * q`,
with gguf-py's rounding order (the sub-block scale product is rounded to float32 first).

Bit planes: a byte array `b` of width W holding P planes of k bits gives element
`plane * W + i` = `(b[i] >> (plane * k)) & mask` -- `bit_planes` below. Layouts (bytes):

    Q2_K  | scales:16 (lo nibble sc, hi nibble m) | qs:64 (2 x 4 planes of 2 bits) | d | dmin |
    Q3_K  | hmask:32 (8 planes of 1 bit) | qs:64 (2 x 4 planes of 2 bits) | scales:12 (6-bit) | d |
    Q4_K  | d | dmin | scales:12 (6-bit sc, m) | qs:128 (4 x 2 planes of 4 bits) |
    Q5_K  | d | dmin | scales:12 | qh:32 (8 planes of 1 bit) | qs:128 (4 x 2 planes of 4 bits) |
    Q6_K  | ql:128 (2 x 2 planes of 4 bits, width 64) | qh:64 (2 x 4 planes of 2 bits) |
          | scales:16 int8 | d |
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.quants.base import Codec, f16_field


def bit_planes(packed: np.ndarray, groups: int, width: int, bits: int) -> np.ndarray:
    """uint8 [n, groups * width] -> uint8 [n, groups, 8 // bits, width] of `bits`-bit fields."""
    n = packed.shape[0]
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    out = np.empty((n, groups, 8 // bits, width), np.uint8)
    np.right_shift(packed.reshape(n, groups, 1, width), shifts, out=out)
    out &= np.uint8((1 << bits) - 1)
    return out


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12-byte scales -> (sc, m) float32 [n, 8], each a 6-bit value.

    bytes 0-3: sc[0:4] low 6 bits | sc[4:8] bits 4-5 in the top 2
    bytes 4-7: m[0:4]  low 6 bits | m[4:8]  bits 4-5 in the top 2
    bytes 8-11: sc[4:8] bits 0-3 (low nibble), m[4:8] bits 0-3 (high nibble)
    """
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _scales_k3(scales: np.ndarray) -> np.ndarray:
    """Q3_K 12-byte scales -> float32 [n, 16] in -32..31: low nibbles from bytes 0-7,
    two high bits from bytes 8-11 (four 2-bit planes), minus 32."""
    lo = bit_planes(scales[:, :8], 1, 8, 4).reshape(-1, 16)
    hi = bit_planes(scales[:, 8:], 1, 4, 2).reshape(-1, 16)
    return ((lo | (hi << np.uint8(4))).astype(np.float32)) - np.float32(32)


def _apply_scales(out: np.ndarray, scale: np.ndarray, offset: np.ndarray | None) -> None:
    """out [n, S * L] (mutated) = out * scale[:, s] - offset[:, s], per sub-block s of L."""
    n, num_sub = scale.shape
    view = out.reshape(n, num_sub, -1)
    view *= scale[:, :, None]
    if offset is not None:
        view -= offset[:, :, None]


class Q2_K(Codec, qtype=GGMLQuantizationType.Q2_K):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        scales = blocks[:, :16]
        dl = f16_field(blocks, 80) * (scales & 0x0F).astype(np.float32)
        ml = f16_field(blocks, 82) * (scales >> 4).astype(np.float32)
        out[...] = bit_planes(blocks[:, 16:80], 2, 32, 2).reshape(out.shape)
        _apply_scales(out, dl, ml)


class Q3_K(Codec, qtype=GGMLQuantizationType.Q3_K):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        dl = f16_field(blocks, 108) * _scales_k3(blocks[:, 96:108])
        q = bit_planes(blocks[:, 32:96], 2, 32, 2).reshape(out.shape)
        # the high bit *clears* the -4 offset: q = low2 - 4 * (1 - hbit)
        high = bit_planes(blocks[:, :32], 1, 32, 1).reshape(out.shape)
        high ^= np.uint8(1)
        high <<= 2
        q -= high  # wraps in uint8; read back as int8
        out[...] = q.view(np.int8)
        _apply_scales(out, dl, None)


class Q4_K(Codec, qtype=GGMLQuantizationType.Q4_K):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        sc, mn = scale_min_k4(blocks[:, 4:16])
        out[...] = bit_planes(blocks[:, 16:], 4, 32, 4).reshape(out.shape)
        _apply_scales(out, f16_field(blocks, 0) * sc, f16_field(blocks, 2) * mn)


class Q5_K(Codec, qtype=GGMLQuantizationType.Q5_K):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        sc, mn = scale_min_k4(blocks[:, 4:16])
        q = bit_planes(blocks[:, 48:], 4, 32, 4).reshape(out.shape)
        high = bit_planes(blocks[:, 16:48], 1, 32, 1).reshape(out.shape)
        high <<= 4
        q |= high
        out[...] = q
        _apply_scales(out, f16_field(blocks, 0) * sc, f16_field(blocks, 2) * mn)


class Q6_K(Codec, qtype=GGMLQuantizationType.Q6_K):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        scale = f16_field(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
        q = bit_planes(blocks[:, :128], 2, 64, 4).reshape(out.shape)
        high = bit_planes(blocks[:, 128:192], 2, 32, 2).reshape(out.shape)
        high <<= 4
        q |= high
        out[...] = q
        out -= np.float32(32)
        _apply_scales(out, scale, None)
