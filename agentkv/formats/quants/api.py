"""The quant entry points: `dequantize`/`quantize` by gguf type number, and `QUANT_NAMES`.

Importing this module registers every codec (floats, legacy, K-quants, MXFP4).
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from agentkv.formats.quants import floats, group32, kquants, legacy, mxfp4  # noqa: F401  (registration)
from agentkv.formats.quants.base import get_codec, registered

# gguf type number -> format name, for every type this package can dequantize.
QUANT_NAMES = MappingProxyType({num: codec.qtype.name for num, codec in sorted(registered().items())})

# The subset that `quantize` accepts.
QUANTIZABLE = frozenset(num for num, codec in registered().items() if codec.can_quantize)


def dequantize(raw: np.ndarray, qtype: int) -> np.ndarray:
    """Decode a stored tensor to float32, as `gguf.quants.dequantize` does, bit for bit.

    raw: uint8 [*rows, bytes_per_row] (F32/F16 may come typed, BF16 as uint16 [*rows, n_cols])
    returns float32 [*rows, n_cols]; a new array, except F32 which is a view of `raw`.
    Raises QuantError for an unsupported qtype or a row that is not whole blocks.
    """
    return get_codec(qtype).dequantize_array(raw)


def quantize(array: np.ndarray, qtype: int) -> np.ndarray:
    """Encode to a stored tensor, as `gguf.quants.quantize` does, byte for byte.

    array: float [*rows, n_cols] with n_cols a multiple of the block size.
    returns uint8 [*rows, bytes_per_row]; F32/F16 return the array cast (no copy if already).
    Raises QuantError for a qtype that cannot be encoded or a row that is not whole blocks.
    """
    return get_codec(qtype).quantize_array(array)
