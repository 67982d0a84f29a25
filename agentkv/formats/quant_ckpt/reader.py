"""Which stored tensors make up one quantized linear, and how they become one logical weight.

A quantized module `X` (e.g. `model.layers.0.self_attn.q_proj`) has no `X.weight` of floats;
its parts are stored under `X.<part>`. The reader presents it as the logical `X.weight`
([out, in]) in a resident block format (`resident.py`), so models and backends never see the
checkpoint's packing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from agentkv.formats.quant_ckpt.resident import Resident, repack_fp8, repack_int
from agentkv.formats.quant_ckpt.scheme import IntScheme, QuantConfigError, Scheme
from agentkv.formats.quant_ckpt.unpack import (
    GroupedFp8,
    GroupedInt,
    unpack_awq,
    unpack_fp8,
    unpack_gptq,
    unpack_pack_quantized,
)

# method -> (the part that marks a quantized module, every part it may have)
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gptq": ("qweight", ("qweight", "qzeros", "scales", "g_idx")),
    "awq": ("qweight", ("qweight", "qzeros", "scales")),
    "pack-quantized": (
        "weight_packed",
        ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"),
    ),
    "float-quantized": ("weight_scale", ("weight", "weight_scale")),
    "fp8": ("weight_scale_inv", ("weight", "weight_scale_inv")),
}
REJECTED_PARTS = ("input_scale", "output_scale", "k_scale", "v_scale")  # static activation scales


class QuantModule(NamedTuple):
    """One quantized linear: the HF names of its parts, keyed by part."""

    prefix: str
    parts: dict[str, str]


def find_modules(scheme: Scheme, hf_names: list[str], where: str) -> dict[str, QuantModule]:
    """The quantized modules among `hf_names`, keyed by their logical `prefix.weight` name."""
    key, parts = PARTS[scheme.method]
    names = set(hf_names)
    modules = {}
    for name in hf_names:
        prefix, _, part = name.rpartition(".")
        if part in REJECTED_PARTS:
            raise QuantConfigError(
                f"{where}: tensor {name!r}: static activation scales are not supported "
                "(activations run in f32; use a checkpoint with dynamic activation scales)"
            )
        if part != key:
            continue
        found = {p: f"{prefix}.{p}" for p in parts if f"{prefix}.{p}" in names}
        modules[f"{prefix}.weight"] = QuantModule(prefix, found)
    return modules


def describe(scheme: Scheme) -> str:
    """The checkpoint format of a module, as `inspect` shows it: `gptq int4 g128 asym`, ..."""
    if isinstance(scheme, IntScheme):
        group = f"g{scheme.group_size}" if scheme.group_size else "per-row"
        act = " act-order" if scheme.act_order else ""
        return f"{scheme.method} int{scheme.bits} {group} {'sym' if scheme.symmetric else 'asym'}{act}"
    block = f" {scheme.block[0]}x{scheme.block[1]}" if scheme.block else ""
    return f"{scheme.method} fp8-e4m3 {scheme.strategy}{block}"


def unpack_module(scheme: Scheme, module: QuantModule, read: Callable[[str], np.ndarray]) -> GroupedInt | GroupedFp8:
    """The module's canonical codes; `read(hf_name)` returns a stored tensor's array."""
    got = {part: read(name) for part, name in module.parts.items()}
    need = {
        "gptq": ("qzeros", "scales"),
        "awq": ("qzeros", "scales"),
        "pack-quantized": ("weight_scale", "weight_shape"),
        "float-quantized": ("weight",),
        "fp8": ("weight",),
    }[scheme.method]
    if not scheme_symmetric(scheme) and scheme.method == "pack-quantized":
        need += ("weight_zero_point",)
    missing = [p for p in need if p not in got]
    if missing:
        raise QuantConfigError(f"module {module.prefix!r}: missing {', '.join(missing)} for {describe(scheme)}")
    name = module.prefix
    if scheme.method == "gptq":
        return unpack_gptq(
            name,
            got["qweight"],
            got["qzeros"],
            got["scales"],
            got.get("g_idx"),
            scheme.bits,
            scheme.group_size,
            scheme.zero_plus_one,
        )
    if scheme.method == "awq":
        return unpack_awq(name, got["qweight"], got["qzeros"], got["scales"], scheme.group_size)
    if scheme.method == "pack-quantized":
        return unpack_pack_quantized(
            name,
            got["weight_packed"],
            got["weight_scale"],
            got.get("weight_zero_point"),
            got["weight_shape"],
            got.get("weight_g_idx"),
            scheme.bits,
            scheme.group_size,
        )
    scale = got["weight_scale_inv" if scheme.method == "fp8" else "weight_scale"]
    return unpack_fp8(name, got["weight"], scale, scheme.block)


def scheme_symmetric(scheme: Scheme) -> bool:
    return not isinstance(scheme, IntScheme) or scheme.symmetric


def load_module(
    scheme: Scheme, module: QuantModule, read: Callable[[str], np.ndarray]
) -> tuple[Resident, tuple[int, int]]:
    """(the resident form, the logical [out, in] shape) of one quantized module."""
    codes = unpack_module(scheme, module, read)
    shape = codes.q.shape if isinstance(codes, GroupedInt) else codes.codes.shape
    resident = repack_int(codes) if isinstance(codes, GroupedInt) else repack_fp8(codes)
    return resident, (int(shape[0]), int(shape[1]))
