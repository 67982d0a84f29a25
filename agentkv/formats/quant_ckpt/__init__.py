"""Quantized safetensors checkpoints (GPTQ, AWQ, compressed-tensors, FP8): schemes, unpacking, resident form."""

from agentkv.formats.quant_ckpt.reader import QuantModule, describe, find_modules, load_module, unpack_module
from agentkv.formats.quant_ckpt.resident import Resident, repack_fp8, repack_int
from agentkv.formats.quant_ckpt.scheme import FloatScheme, IntScheme, QuantConfigError, Scheme, parse_scheme
from agentkv.formats.quant_ckpt.unpack import GroupedFp8, GroupedInt, QuantTensorError

__all__ = [
    "FloatScheme",
    "GroupedFp8",
    "GroupedInt",
    "IntScheme",
    "QuantConfigError",
    "QuantModule",
    "QuantTensorError",
    "Resident",
    "Scheme",
    "describe",
    "find_modules",
    "load_module",
    "parse_scheme",
    "repack_fp8",
    "repack_int",
    "unpack_module",
]
