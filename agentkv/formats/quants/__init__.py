"""Quant codecs: GGML block formats to float32 and back, bit-identical to gguf-py."""

from agentkv.formats.quants.api import QUANT_NAMES, QUANTIZABLE, dequantize, quantize
from agentkv.formats.quants.base import Codec, block_info, get_codec, qtype_label, row_bytes
from agentkv.formats.quants.repack import Group32, repack_q4k_as_group32

__all__ = [
    "QUANT_NAMES",
    "QUANTIZABLE",
    "Codec",
    "Group32",
    "block_info",
    "dequantize",
    "get_codec",
    "qtype_label",
    "quantize",
    "repack_q4k_as_group32",
    "row_bytes",
]
