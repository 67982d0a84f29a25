"""Plain float codecs: F32, F16 (typed arrays, as gguf-py passes them) and BF16 (raw bits).

F32 and F16 keep gguf-py's conventions: dequantize *views* the data as the type (so uint8
bytes or an already-typed array both work) and quantize is a dtype cast straight from the
input dtype (float64 -> float16 directly, never through float32: that would round twice).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from agentkv.formats.quants.base import Codec, as_row_bytes


def _typed_view(raw: np.ndarray, codec: type[Codec], dtype: type) -> np.ndarray:
    return as_row_bytes(raw, codec).view(dtype)


class F32(Codec, qtype=GGMLQuantizationType.F32):
    can_quantize = True

    @classmethod
    def dequantize_array(cls, raw: np.ndarray) -> np.ndarray:
        """A float32 view of `raw` (no copy when it is contiguous)."""
        return _typed_view(raw, cls, np.float32)

    @classmethod
    def quantize_array(cls, array: np.ndarray) -> np.ndarray:
        return np.asarray(array).astype(np.float32, copy=False)


class F16(Codec, qtype=GGMLQuantizationType.F16):
    can_quantize = True

    @classmethod
    def dequantize_array(cls, raw: np.ndarray) -> np.ndarray:
        return _typed_view(raw, cls, np.float16).astype(np.float32)

    @classmethod
    def quantize_array(cls, array: np.ndarray) -> np.ndarray:
        return np.asarray(array).astype(np.float16, copy=False)


class BF16(Codec, qtype=GGMLQuantizationType.BF16):
    """bfloat16 is the top half of a float32: widen by a 16-bit shift, narrow by
    round-to-nearest-even on the dropped half (ggml_compute_fp32_to_bf16), NaNs made quiet."""

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        bits = out.view(np.uint32)
        bits[...] = blocks.view(np.uint16)
        bits <<= 16

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        n = blocks.view(np.uint32).copy()
        nan = (n & 0x7FFFFFFF) > 0x7F800000
        n[nan] = (n[nan] & np.uint32(0xFFFF0000)) | np.uint32(64 << 16)
        # no uint32 overflow: the largest non-NaN pattern (-inf) is 0xff800000
        n += np.uint32(0x7FFF) + ((n >> 16) & 1)
        n >>= 16
        return n.astype(np.uint16).view(np.uint8)
