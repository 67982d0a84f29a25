"""PEFT adapters on an MoE model's fused expert tensors (`target_parameters`, PEFT >= 0.17):
read into one (A, B) pair per layer, expert and projection (gate, up, down).

transformers 5.x keeps a layer's routed experts as two 3-D parameters, `mlp.experts.gate_up_proj`
`[E, 2I, H]` (gate rows, then up rows) and `mlp.experts.down_proj` `[E, H, I]` (Qwen2/3-MoE,
OLMoE, Mixtral alike). PEFT's `ParamWrapper` adapts one parameter each; two on one module nest,
so the file names them by depth, not by parameter:

    model.layers.N.mlp.experts.lora_A.weight             [r*E, in]   (one parameter)
    model.layers.N.mlp.experts.base_layer.lora_A.weight  [r*E, in]   (the other)
    ...lora_B.weight                                     [out, r*E]

Which is which follows from the shapes (gate_up: in = H, out = 2I; down: in = I, out = H;
the two never coincide). Expert e's factors, as PEFT's `get_delta_weight` reshapes them:
A_e = A[e*r:(e+1)*r] (expert-major) and B_e = B[:, e::E] (rank-major columns); the delta of
expert e is `scaling * B_e @ A_e` `[out, in]`, scaling as for any module (`alpha / r` or
`alpha / sqrt(r)`, r and alpha by `rank_pattern` / `alpha_pattern` on the parameter's name).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.formats.errors import FormatError

EXPERT_PARAMS = ("gate_up_proj", "down_proj")
_WRAPPER = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.(?P<block>\w+)\.experts(?P<depth>(?:\.base_layer)*)$")


def is_expert_wrapper(module: str) -> bool:
    """Whether a PEFT module name is a ParamWrapper on a layer's fused experts."""
    return _WRAPPER.search(module) is not None


def expert_modules(file: Path, pairs: dict[str, dict[str, np.ndarray]], config: dict[str, Any], module_type):
    """The `module_type` (LoraModule) of every layer, expert and projection of the expert
    wrappers in `pairs` (module name -> {"A", "B"}); raises AdapterError (a FormatError)
    naming the file and module when a wrapper's shapes do not say which parameter it is."""
    params = _target_params(file, config)
    layers: dict[int, list[str]] = {}
    for name in pairs:
        layers.setdefault(int(_WRAPPER.search(name)["layer"]), []).append(name)
    out = []
    for layer, names in sorted(layers.items()):
        for name, param in _which(file, names, pairs, params).items():
            out.extend(_split(file, name, param, pairs[name], config, layer, module_type))
    return out


def _target_params(file: Path, config: dict[str, Any]) -> list[str]:
    found = []
    for key in config.get("target_parameters") or []:
        param = str(key).rpartition(".")[2]
        if param not in EXPERT_PARAMS:
            raise _error(f"{file}: target_parameters entry {key!r} is not supported (agentkv takes {EXPERT_PARAMS})")
        found.append(param)
    return sorted(set(found))


def _which(file: Path, names: list[str], pairs: dict, params: list[str]) -> dict[str, str]:
    """Wrapper module -> the parameter it adapts (see the module docstring)."""
    for name in names:
        if set(pairs[name]) != {"A", "B"}:
            raise _error(f"{file}: module {name!r} has lora_{'/'.join(sorted(pairs[name]))} but needs both A and B")
    if len(names) > len(params) or not params:
        raise _error(
            f"{file}: modules {sorted(names)!r} adapt {len(names)} expert parameters; "
            f"the config's target_parameters name {params!r}"
        )
    if len(names) == 1:
        if len(params) == 1:
            return {names[0]: params[0]}
        raise _error(
            f"{file}: module {names[0]!r} is the only expert wrapper of its layer but target_parameters names "
            f"both {EXPERT_PARAMS}; cannot tell which one it adapts (lora_A {list(pairs[names[0]]['A'].shape)})"
        )
    x, y = sorted(names)
    ax, bx, ay, by = pairs[x]["A"], pairs[x]["B"], pairs[y]["A"], pairs[y]["B"]
    if ax.shape[1] == by.shape[0] and bx.shape[0] == 2 * ay.shape[1]:
        return {x: "gate_up_proj", y: "down_proj"}
    if ay.shape[1] == bx.shape[0] and by.shape[0] == 2 * ax.shape[1]:
        return {y: "gate_up_proj", x: "down_proj"}
    raise _error(
        f"{file}: modules {x!r} (lora_A {list(ax.shape)}, lora_B {list(bx.shape)}) and {y!r} (lora_A "
        f"{list(ay.shape)}, lora_B {list(by.shape)}) are not gate_up_proj [2I, H] and down_proj [H, I] adapters"
    )


def _split(file: Path, name: str, param: str, pair: dict, config: dict, layer: int, module_type) -> list:
    """One wrapper's (A [r*E, in], B [out, r*E]) -> a module per expert (and gate/up half)."""
    from agentkv.formats.lora import pattern_value

    a, b = pair["A"], pair["B"]
    key = f"{name.replace('.base_layer', '')}.{param}"
    rank = int(pattern_value(config.get("rank_pattern") or {}, key, config["r"]))
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[0] % rank:
        raise _error(
            f"{file}: module {key!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not "
            f"[r*experts, in] and [out, r*experts] with r={rank}"
        )
    experts = a.shape[0] // rank
    alpha = float(pattern_value(config.get("alpha_pattern") or {}, key, config["lora_alpha"]))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    if param == "gate_up_proj" and b.shape[0] % 2:
        raise _error(f"{file}: module {key!r}: lora_B {list(b.shape)} has an odd row count for gate+up")
    out = []
    for e in range(experts):
        ae = np.ascontiguousarray(a[e * rank : (e + 1) * rank])
        be = np.ascontiguousarray(b[:, e::experts])
        if param == "down_proj":
            out.append(module_type(f"{key}[{e}]", layer, "down", ae, be, scaling, expert=e))
            continue
        half = be.shape[0] // 2
        out.append(module_type(f"{key}[{e}].gate", layer, "gate", ae, be[:half].copy(), scaling, expert=e))
        out.append(module_type(f"{key}[{e}].up", layer, "up", ae, be[half:].copy(), scaling, expert=e))
    return out


def _error(message: str) -> FormatError:
    from agentkv.formats.lora import AdapterError

    return AdapterError(message)
