"""Compiled batch-invariant CPU kernels (paged attention, quantized matmul) of the `cpu` backend."""

from agentkv.hal.kernels.loader import build_directory, build_id, load, unavailable_reason
from agentkv.hal.kernels.qtypes import FILE_QTYPE, INTERLEAVED, QTYPE_BLOCK, SUPPORTED_QTYPES, row_bytes

__all__ = [
    "FILE_QTYPE",
    "INTERLEAVED",
    "QTYPE_BLOCK",
    "SUPPORTED_QTYPES",
    "build_directory",
    "build_id",
    "load",
    "row_bytes",
    "unavailable_reason",
]
