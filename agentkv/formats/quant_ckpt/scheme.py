"""Quant schemes of HF safetensors checkpoints: `quantization_config` of config.json, validated.

One small frozen scheme per family. Every field the loaders read is checked here, and a field
or value they do not implement raises QuantConfigError naming the field, the value and what is
supported, so no checkpoint is ever read with a convention it does not have.

    gptq                 bits 4|8, group_size (-1 = one group per row), sym, desc_act,
                         checkpoint_format gptq (v1: stored zero + 1) | gptq_v2 (stored zero)
    awq                  bits 4, version gemm, zero_point true, group_size
    compressed-tensors   format pack-quantized (int 4|8, group|channel, symmetric or not,
                         actorder) | float-quantized (float 8 e4m3, tensor|channel|block)
    fp8                  HF fine-grained FP8: e4m3 weights, weight_scale_inv per block
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentkv.formats.errors import FormatError


class QuantConfigError(FormatError):
    """A quantization_config field or value this loader does not implement."""


UNSUPPORTED_METHODS = {
    "exl2": "EXL2 has no CPU oracle and no loader here",
    "bitsandbytes": "bitsandbytes checkpoints are not read here",
}


def _check(where: str, field: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise QuantConfigError(
            f"{where}: {field}={value!r} is not supported (supported: {', '.join(repr(a) for a in allowed)})"
        )
    return value


@dataclass(frozen=True, slots=True)
class IntScheme:
    """Integer weights, x = scale * (q - zero), per group of `group_size` input columns
    (None = one group per row). `method` names the packing of the stored tensors."""

    method: str  # gptq | awq | pack-quantized
    bits: int
    group_size: int | None
    symmetric: bool
    zero_plus_one: bool = False  # GPTQ v1 stores zero - 1
    act_order: bool = False  # a g_idx tensor may permute the groups


@dataclass(frozen=True, slots=True)
class FloatScheme:
    """FP8 e4m3 weights times a scale: per tensor, per output row, or per [rows, cols] block."""

    method: str  # float-quantized | fp8
    strategy: str  # tensor | channel | block
    block: tuple[int, int] | None = None


Scheme = IntScheme | FloatScheme


def parse_scheme(config: dict[str, Any], where: str) -> Scheme | None:
    """The scheme of config.json's `quantization_config`; None for an unquantized model."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise QuantConfigError(f"{where}: quantization_config is not an object")
    method = qc.get("quant_method")
    if method in UNSUPPORTED_METHODS:
        raise QuantConfigError(f"{where}: quant_method={method!r} is not supported: {UNSUPPORTED_METHODS[method]}")
    parsers = {"gptq": _gptq, "awq": _awq, "compressed-tensors": _compressed, "fp8": _fp8}
    _check(where, "quant_method", method, tuple(parsers))
    return parsers[method](qc, where)


def _group(where: str, value: Any) -> int | None:
    if value == -1:
        return None
    if not isinstance(value, int) or value <= 0:
        raise QuantConfigError(f"{where}: group_size={value!r} must be -1 or a positive integer")
    return value


def _gptq(qc: dict[str, Any], where: str) -> IntScheme:
    bits = _check(where, "bits", qc.get("bits"), (4, 8))
    fmt = _check(where, "checkpoint_format", qc.get("checkpoint_format", "gptq"), ("gptq", "gptq_v2"))
    sym = _check(where, "sym", qc.get("sym", True), (True, False))
    desc_act = _check(where, "desc_act", qc.get("desc_act", False), (True, False))
    return IntScheme(
        "gptq", bits, _group(where, qc.get("group_size", 128)), sym, zero_plus_one=fmt == "gptq", act_order=desc_act
    )


def _awq(qc: dict[str, Any], where: str) -> IntScheme:
    bits = _check(where, "bits", qc.get("bits", qc.get("w_bit")), (4,))
    _check(where, "version", str(qc.get("version", "gemm")).lower(), ("gemm",))
    _check(where, "zero_point", qc.get("zero_point", True), (True,))
    return IntScheme("awq", bits, _group(where, qc.get("group_size", qc.get("q_group_size", 128))), False)


def _compressed(qc: dict[str, Any], where: str) -> Scheme:
    fmt = _check(where, "format", qc.get("format"), ("pack-quantized", "float-quantized"))
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise QuantConfigError(f"{where}: config_groups has {len(groups)} groups; exactly one is supported")
    ((name, group),) = groups.items()
    here = f"{where}: config_groups.{name}"
    _check(here, "targets", tuple(group.get("targets", ())), (("Linear",),))
    for kind in ("input_activations", "output_activations"):
        args = group.get(kind)
        if args is not None:  # activations stay f32 here: only dynamic (computed) scales are honest
            _check(f"{here}.{kind}", "dynamic", args.get("dynamic"), (True, "local"))
    w = group.get("weights") or {}
    here = f"{here}.weights"
    strategy = w.get("strategy")
    if fmt == "float-quantized":
        _check(here, "type", w.get("type"), ("float",))
        _check(here, "num_bits", w.get("num_bits"), (8,))
        _check(here, "strategy", strategy, ("tensor", "channel", "block"))
        _check(here, "symmetric", w.get("symmetric", True), (True,))
        block = tuple(w["block_structure"]) if strategy == "block" else None
        return FloatScheme("float-quantized", strategy, block)
    _check(here, "type", w.get("type"), ("int",))
    bits = _check(here, "num_bits", w.get("num_bits"), (4, 8))
    _check(here, "strategy", strategy, ("group", "channel"))
    _check(here, "dynamic", w.get("dynamic", False), (False,))
    actorder = _check(here, "actorder", w.get("actorder"), (None, "group", "weight", "static", "dynamic"))
    group_size = _group(here, w.get("group_size")) if strategy == "group" else None
    symmetric = _check(here, "symmetric", w.get("symmetric", True), (True, False))
    return IntScheme("pack-quantized", bits, group_size, symmetric, act_order=actorder == "group")


def _fp8(qc: dict[str, Any], where: str) -> FloatScheme:
    _check(where, "fmt", qc.get("fmt", "e4m3"), ("e4m3",))
    _check(where, "activation_scheme", qc.get("activation_scheme", "dynamic"), ("dynamic",))
    block = qc.get("weight_block_size")
    if block is None:
        return FloatScheme("fp8", "tensor")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise QuantConfigError(f"{where}: weight_block_size={block!r} must be two positive integers")
    return FloatScheme("fp8", "block", (block[0], block[1]))
