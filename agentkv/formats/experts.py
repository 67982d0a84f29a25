"""Per-expert views of a layer's routed experts, from either file format, without a copy.

A GGUF holds each projection of a layer's experts as one 3-D tensor, `blk.{i}.ffn_{gate,up,
down}_exps.weight` `[num_experts, out, in]`, every expert's rows the file's quant blocks; the
view of expert e is `data[e]`, still memory-mapped. A HF folder saved by transformers holds one
2-D tensor per expert and projection (names gguf-py does not map, so they keep their HF names):

    qwen2moe / qwen3moe / olmoe:  model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
    mixtral:                      model.layers.{i}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight

Granite-4.0-H keeps each layer's gate and up projections as one 3-D bank, gate rows first
(`model.layers.{i}.block_sparse_moe.input_linear.weight` `[num_experts, 2 f, d]`), which the
views cut in halves; its down bank gguf-py maps to `ffn_down_exps`.
"""

from __future__ import annotations

from typing import NamedTuple

from agentkv.formats.errors import FormatError
from agentkv.formats.source import ModelSource, TensorInfo

EXPERT_PROJECTIONS = ("gate", "up", "down")
_FUSED_GATE_UP = "model.layers.{i}.block_sparse_moe.input_linear.weight"  # granitemoehybrid
_HF_PATTERNS = {
    "gate": (
        "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
        "model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight",
    ),
    "up": (
        "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
        "model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight",
    ),
    "down": (
        "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
        "model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight",
    ),
}


class ExpertTensors(NamedTuple):
    """One projection of a layer's experts: `views[e]` is expert e's `[out, in]` tensor, and
    `sources` the names of the file tensors they view (one 3-D tensor, or one per expert)."""

    views: tuple[TensorInfo, ...]
    sources: tuple[str, ...]


def packed_name(layer: int, projection: str) -> str:
    """The GGUF name of a layer's 3-D expert tensor for `projection` (gate, up or down)."""
    return f"blk.{layer}.ffn_{projection}_exps.weight"


def expert_tensors(source: ModelSource, layer: int, projection: str, num_experts: int) -> ExpertTensors:
    """Expert views of `projection` in `layer`; raises FormatError naming the file and the
    tensor that is missing or has the wrong expert count."""
    if projection not in EXPERT_PROJECTIONS:
        raise ValueError(f"projection must be one of {EXPERT_PROJECTIONS}, got {projection!r}")
    name = packed_name(layer, projection)
    if source.has_tensor(name):
        info = source.tensor(name)
        if len(info.shape) != 3 or info.shape[0] != num_experts:
            raise FormatError(
                f"{source.path}: tensor {name!r} has shape {list(info.shape)}, expected "
                f"[{num_experts} experts, out, in]"
            )
        views = tuple(TensorInfo(f"{name}[{e}]", info.shape[1:], info.qtype, info.data[e]) for e in range(num_experts))
        return ExpertTensors(views, (name,))
    fused = _FUSED_GATE_UP.format(i=layer)
    if projection != "down" and source.has_tensor(fused):
        return _fused_half(source, fused, projection == "up", num_experts)
    for pattern in _HF_PATTERNS[projection]:
        names = [pattern.format(i=layer, e=e) for e in range(num_experts)]
        if source.has_tensor(names[0]):
            missing = [n for n in names if not source.has_tensor(n)]
            if missing:
                raise FormatError(
                    f"{source.path}: missing tensor {missing[0]!r} ({num_experts} experts expected in layer {layer})"
                )
            return ExpertTensors(tuple(source.tensor(n) for n in names), tuple(names))
    raise FormatError(
        f"{source.path}: missing tensor {name!r} (or its per-expert HF tensors) "
        f"needed by a mixture-of-experts layer {layer}"
    )


def _fused_half(source: ModelSource, name: str, second: bool, num_experts: int) -> ExpertTensors:
    """The gate (first) or up (`second`) half of a fused `[num_experts, 2 f, d]` bank."""
    info = source.tensor(name)
    if len(info.shape) != 3 or info.shape[0] != num_experts or info.shape[1] % 2:
        raise FormatError(
            f"{source.path}: tensor {name!r} has shape {list(info.shape)}, expected [{num_experts} experts, 2 f, d]"
        )
    f = info.shape[1] // 2
    rows = slice(f, 2 * f) if second else slice(0, f)
    views = tuple(
        TensorInfo(f"{name}[{e}][{'up' if second else 'gate'}]", (f, info.shape[2]), info.qtype, info.data[e][rows])
        for e in range(num_experts)
    )
    return ExpertTensors(views, (name,))
