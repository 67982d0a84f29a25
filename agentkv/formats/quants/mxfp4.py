"""MXFP4 (gguf type 39): 32 E2M1 codes sharing one E8M0 scale, and the transformers form of it.

GGUF block (17 bytes), ggml's `block_mxfp4`; element i's code is the low nibble of byte i and
element i + 16's the high nibble (Q4_0's order):

    | e: 1 (E8M0) | qs: 16 |        x = KVALUES[q] * e8m0_half(e)

ggml keeps the E2M1 values doubled (integers, so its kernels can use int8 dot products) and
halves the scale to match: `e8m0_half(e)` is 2^(e - 128), with e = 0 and 1 as the float32
subnormals 2^-128 and 2^-127 and e = 255 as the finite 2^127 (not the OCP NaN), exactly as
gguf-py's `e8m0_to_fp32_half`. Every product is a power of two times an integer below 16, so
it is exact in float32 and the value does not depend on how it is computed.

transformers saves gpt-oss experts as `*_blocks` uint8 [..., G, 16] plus `*_scales` uint8
[..., G]: code j of a group is the low nibble of byte j // 2 when j is even, the high nibble
when odd, with value FP4_VALUES[q] * 2^(s - 127). The codes index the same values in the same
order (FP4_VALUES = KVALUES / 2) and the scale byte is the same byte, so `from_hf_blocks` only
moves nibbles. The one difference: code 8 is -0.0 there and +0.0 here (equal as numbers).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.errors import QuantError
from agentkv.formats.quants.base import Codec

HALF = 16
# E2M1 values doubled, by 4-bit code (sign bit 3): 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two.
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_KVALUES_F32 = KVALUES.astype(np.float32)


def _e8m0_half_table() -> np.ndarray:
    """float32 [256]: 2^(e - 128) for each E8M0 byte e, built from its float32 bits."""
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


E8M0_HALF = _e8m0_half_table()


def _unpack(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 16] -> uint8 [n, 32] codes: low nibbles (elements 0..15), then high."""
    q = np.empty((qs.shape[0], 2 * HALF), np.uint8)
    np.bitwise_and(qs, 0x0F, out=q[:, :HALF])
    np.right_shift(qs, 4, out=q[:, HALF:])
    return q


class MXFP4(Codec, qtype=GGMLQuantizationType.MXFP4):
    @classmethod
    def _chunk_blocks(cls) -> int:
        return 2048  # the encoder's [n, 32, 16] error table stays ~4 MiB

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        out[...] = _KVALUES_F32[_unpack(blocks[:, 1:])]
        with np.errstate(over="ignore"):  # 6 * 2^127 (scale 254/255, code 7) is inf, as in gguf-py
            out *= E8M0_HALF[blocks[:, :1]]

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """gguf-py's encoder: the scale from the block's largest magnitude (floor(log2) - 2,
        so that magnitude lands in 4..8 of the doubled values), each element the nearest value
        (the first code on a tie, so +0 over -0)."""
        amax = np.abs(blocks).max(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            exponent = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
        d = E8M0_HALF[exponent]  # [n, 1]
        errors = np.abs(d[:, :, None] * _KVALUES_F32 - blocks[:, :, None])  # [n, 32, 16]
        q = errors.argmin(axis=-1).astype(np.uint8)
        return np.concatenate([exponent, q[:, :HALF] | (q[:, HALF:] << np.uint8(4))], axis=-1)


def from_hf_blocks(blocks: np.ndarray, scales: np.ndarray, name: str = "tensor") -> np.ndarray:
    """transformers' MXFP4 pair -> GGUF MXFP4 rows, a new array.

    blocks: uint8 [*rows, G, 16], scales: uint8 [*rows, G]  ->  uint8 [*rows, G * 17]
    (rows of G * 32 logical columns). Raises QuantError naming `name` for a shape mismatch
    or a scale byte 255 (NaN in E8M0; transformers would decode it to inf or NaN).
    """
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise QuantError(f"{name}: MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.ndim < 2 or blocks.shape[-1] != HALF or blocks.shape[:-1] != scales.shape:
        raise QuantError(
            f"{name}: MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair "
            f"(need blocks [..., G, {HALF}] and scales [..., G])"
        )
    if np.any(scales == 255):
        raise QuantError(f"{name}: MXFP4 scale byte 255 (E8M0 NaN) at {np.argwhere(scales == 255)[0].tolist()}")
    pairs, out = blocks.reshape(-1, HALF), np.empty((scales.size, 1 + HALF), np.uint8)
    out[:, 0] = scales.reshape(-1)
    for start in range(0, len(out), _REPACK_CHUNK):  # temporaries stay cache-sized
        _repack(pairs[start : start + _REPACK_CHUNK], out[start : start + _REPACK_CHUNK, 1:])
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * (1 + HALF))


_REPACK_CHUNK = 1 << 16  # blocks


def _repack(hf: np.ndarray, qs: np.ndarray) -> None:
    """transformers' 16 code bytes per block -> GGUF's (`qs` mutated). Element 2j is the low
    nibble of hf[j] and 2j + 1 its high nibble; GGUF byte k holds elements k (low) and k + 16
    (high), which are nibbles of hf[k // 2] and hf[8 + k // 2]:

        qs[2j]     = lo(hf[j]) | lo(hf[8 + j]) << 4
        qs[2j + 1] = hi(hf[j]) | hi(hf[8 + j]) << 4
    """
    first, second = hf[:, :8], hf[:, 8:]
    np.bitwise_or(first & np.uint8(0x0F), second << np.uint8(4), out=qs[:, 0::2])
    np.bitwise_or(first >> np.uint8(4), second & np.uint8(0xF0), out=qs[:, 1::2])
