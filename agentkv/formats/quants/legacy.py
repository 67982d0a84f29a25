"""Legacy 32-element block codecs: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (decode and encode).

Block layouts (bytes; d and m are float16, qs packs element i in the low nibble of byte i
and element i+16 in the high nibble, qh bit i is the fifth bit of element i):

    Q8_0  | d:2 | qs:32 int8 |                 x = qs * d
    Q4_0  | d:2 | qs:16 |                      x = (q - 8) * d
    Q4_1  | d:2 | m:2 | qs:16 |                x = (q * d) + m
    Q5_0  | d:2 | qh:4 | qs:16 |               x = (q - 16) * d
    Q5_1  | d:2 | m:2 | qh:4 | qs:16 |         x = (q * d) + m

Encoders repeat gguf-py's float32 arithmetic (itself ggml-quants.c's reference code) so the
bytes match exactly, including `-0.0` scales of all-zero blocks.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.quants.base import Codec, f16_field

HALF = 16  # elements per nibble plane of a 32-element block


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 16] packed -> uint8 [n, 32]: low nibbles then high nibbles."""
    q = np.empty((qs.shape[0], 2 * HALF), np.uint8)
    np.bitwise_and(qs, 0x0F, out=q[:, :HALF])
    np.right_shift(qs, 4, out=q[:, HALF:])
    return q


def _unpack_5bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """qh uint8 [n, 4] (little-endian bit i = element i), qs [n, 16] -> uint8 [n, 32] in 0..31."""
    q = np.unpackbits(qh, axis=1, bitorder="little")
    q <<= 4
    q |= _unpack_nibbles(qs)
    return q


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 [n, 32] (values < 32) -> uint8 [n, 16]: the low 4 bits of elements i and i+16."""
    return (q[:, :HALF] & np.uint8(0x0F)) | (q[:, HALF:] << np.uint8(4))


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d)


def _signed_absmax(blocks: np.ndarray) -> np.ndarray:
    """The element of largest magnitude (first on ties), keeping its sign: float32 [n, 1]."""
    imax = np.abs(blocks).argmax(axis=-1, keepdims=True)
    return np.take_along_axis(blocks, imax, axis=-1)


def _round_away(x: np.ndarray) -> np.ndarray:
    """Round half away from zero (C `roundf`) in place, as gguf-py's `np_roundf`: the
    fraction `x - trunc(x)` is exact, so `trunc(2 * fraction)` adds the +-1 of a half or more
    (`floor(x + 0.5)` would be wrong: 0.49999997 + 0.5 rounds up to 1.0 in float32)."""
    whole = np.trunc(x)
    x -= whole
    x *= np.float32(2)
    np.trunc(x, out=x)
    x += whole
    return x


def _assemble(*fields: np.ndarray) -> np.ndarray:
    return np.concatenate([f.view(np.uint8) if f.dtype == np.float16 else f for f in fields], 1)


class Q8_0(Codec, qtype=GGMLQuantizationType.Q8_0):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = blocks[:, 2:].view(np.int8)
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
        qs = _round_away(blocks * _inverse(d)).astype(np.int8).view(np.uint8)
        return _assemble(d.astype(np.float16), qs)


class Q4_0(Codec, qtype=GGMLQuantizationType.Q4_0):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = _unpack_nibbles(blocks[:, 2:])
        out -= np.float32(8)
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = _signed_absmax(blocks) / np.float32(-8)
        q = np.trunc(blocks * _inverse(d) + np.float32(8.5)).astype(np.uint8)
        np.minimum(q, 15, out=q)
        return _assemble(d.astype(np.float16), _pack_nibbles(q))


class Q4_1(Codec, qtype=GGMLQuantizationType.Q4_1):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = _unpack_nibbles(blocks[:, 4:])
        out *= f16_field(blocks, 0)
        out += f16_field(blocks, 2)

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        lo = blocks.min(axis=-1, keepdims=True)
        d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(15)
        q = np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8)
        np.minimum(q, 15, out=q)
        return _assemble(d.astype(np.float16), lo.astype(np.float16), _pack_nibbles(q))


class Q5_0(Codec, qtype=GGMLQuantizationType.Q5_0):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = _unpack_5bit(blocks[:, 2:6], blocks[:, 6:])
        out -= np.float32(16)
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        d = _signed_absmax(blocks) / np.float32(-16)
        q = np.trunc(blocks * _inverse(d) + np.float32(16.5)).astype(np.uint8)
        np.minimum(q, 31, out=q)
        qh = np.packbits(q >> np.uint8(4), axis=1, bitorder="little")
        return _assemble(d.astype(np.float16), qh, _pack_nibbles(q))


class Q5_1(Codec, qtype=GGMLQuantizationType.Q5_1):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = _unpack_5bit(blocks[:, 4:8], blocks[:, 8:])
        out *= f16_field(blocks, 0)
        out += f16_field(blocks, 2)

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        lo = blocks.min(axis=-1, keepdims=True)
        d = (blocks.max(axis=-1, keepdims=True) - lo) / np.float32(31)
        q = np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8)
        np.minimum(q, 31, out=q)
        qh = np.packbits(q >> np.uint8(4), axis=1, bitorder="little")
        return _assemble(d.astype(np.float16), lo.astype(np.float16), qh, _pack_nibbles(q))
