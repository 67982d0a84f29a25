"""Compiled batch-invariant CPU kernels (paged attention, quantized matmul) for the torch backend."""
from agentkv.hal.kernels.loader import build_directory, load, unavailable_reason
from agentkv.hal.kernels.qtypes import QTYPE_BLOCK, SUPPORTED_QTYPES, row_bytes

__all__ = ["QTYPE_BLOCK", "SUPPORTED_QTYPES", "build_directory", "load", "row_bytes", "unavailable_reason"]
