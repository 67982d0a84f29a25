"""agentkv's own group-32 block formats for quantized safetensors checkpoints (not GGUF types).

GPTQ, AWQ and compressed-tensors store integer codes with a scale and a zero point per group;
FP8 checkpoints store e4m3 codes with a scale per tensor, row or block. These blocks keep the
codes as they are and widen the scale and zero point to float32, so a block decodes with the
format's own formula and a single rounding:

    I4G32  | scale f32 | zero f32 | qs:16 (Q4_0 nibble order) |   x = scale * (q - zero)
    I8G32  | scale f32 | zero f32 | qs:32 u8 |                    x = scale * (q - zero)
    F8G32  | scale f32 | qs:32 e4m3fn |                           x = e4m3(q) * scale

`q - zero` is a small integer, exact in float32. The type numbers sit above every GGML type.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from agentkv.formats.quants.base import Codec

BLOCK = 32


class AgentQuantType(IntEnum):
    I4G32 = 1004
    I8G32 = 1008
    F8G32 = 1016


def _e4m3_table() -> np.ndarray:
    """float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
    S.1111.111 is NaN; exponent 0 is subnormal (m / 8 * 2^-6)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = np.where((exp == 15) & (man == 7), np.nan, value)
    return (sign * value).astype(np.float32)


E4M3_TABLE = _e4m3_table()


def _f32_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, offset : offset + 4]).view(np.float32)


def _head(rows: int, *fields: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(f, dtype=np.float32).view(np.uint8).reshape(rows, -1, 4) for f in fields]


class I4G32(Codec, qtype=AgentQuantType.I4G32, block=(BLOCK, 24)):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        qs = blocks[:, 8:]
        out[:, :16] = qs & 0x0F
        out[:, 16:] = qs >> 4
        out -= _f32_field(blocks, 4)
        out *= _f32_field(blocks, 0)

    @classmethod
    def encode(cls, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """q uint8 [out, in] (0..15), scale and zero float32 [out, in / 32] -> uint8 [out, in / 32 * 24]."""
        rows = q.shape[0]
        qs = q.reshape(rows, -1, 2, 16)
        packed = qs[:, :, 0] | (qs[:, :, 1] << np.uint8(4))
        return np.concatenate([*_head(rows, scale, zero), packed], axis=-1).reshape(rows, -1)


class I8G32(Codec, qtype=AgentQuantType.I8G32, block=(BLOCK, 40)):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = blocks[:, 8:]
        out -= _f32_field(blocks, 4)
        out *= _f32_field(blocks, 0)

    @classmethod
    def encode(cls, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        rows = q.shape[0]
        return np.concatenate([*_head(rows, scale, zero), q.reshape(rows, -1, BLOCK)], axis=-1).reshape(rows, -1)


class F8G32(Codec, qtype=AgentQuantType.F8G32, block=(BLOCK, 36)):
    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = E4M3_TABLE[blocks[:, 4:]]
        out *= _f32_field(blocks, 0)

    @classmethod
    def encode(cls, codes: np.ndarray, scale: np.ndarray, zero: None = None) -> np.ndarray:
        rows = codes.shape[0]
        return np.concatenate([*_head(rows, scale), codes.reshape(rows, -1, BLOCK)], axis=-1).reshape(rows, -1)
