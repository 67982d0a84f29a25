"""LoRA adapter files: PEFT folders (`adapter_config.json` + `adapter_model.safetensors`) read
into per-module (A, B, scaling) pairs named by decoder layer and projection.

PEFT's conventions, kept exactly: a module's delta is `scaling * B @ A` with A `[r, in]` and
B `[out, r]`; scaling is `alpha / r`, or `alpha / sqrt(r)` with `use_rslora`; `rank_pattern`
and `alpha_pattern` override r and alpha for the modules whose name ends in a pattern
(`(.*\\.)?{pattern}$`, the first pattern that matches). Only what agentkv can apply is accepted:
attention q/k/v/o, the dense MLP's gate/up/down of each decoder layer, and an MoE layer's routed
experts where PEFT targets their fused parameters (`formats/lora_experts.py`); anything else (the
embeddings, the LM head, routers, shared experts, DoRA, biases) is refused with the module's name.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.formats.errors import FormatError
from agentkv.formats.lora_experts import expert_modules, is_expert_wrapper
from agentkv.formats.quants import dequantize
from agentkv.formats.safetensors import DTYPES, _array, _file_entries

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT module (its last two names) -> agentkv's projection kind
KINDS = {
    ("self_attn", "q_proj"): "q",
    ("self_attn", "k_proj"): "k",
    ("self_attn", "v_proj"): "v",
    ("self_attn", "o_proj"): "o",
    ("mlp", "gate_proj"): "gate",
    ("mlp", "up_proj"): "up",
    ("mlp", "down_proj"): "down",
}
_MODULE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.*?)\.lora_(?P<part>[AB])(?:\.default)?\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.(?P<block>\w+)\.(?P<proj>\w+)$")


class AdapterError(FormatError):
    """An adapter folder or file that cannot be read or applied; names the file and module."""


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One projection's adapter: `a` f32 `[r, in]`, `b` f32 `[out, r]`, delta = scaling * B @ A."""

    name: str  # the PEFT module name, for errors
    layer: int
    kind: str  # q k v o gate up down
    a: np.ndarray
    b: np.ndarray
    scaling: float
    interleaved: bool = False  # B's q/k rows in llama.cpp's permuted order (a llama GGUF adapter)
    expert: int = -1  # the routed expert whose gate/up/down it adapts (-1: a dense projection)


@dataclass(frozen=True, slots=True)
class LoraAdapterFile:
    """An adapter as read: its modules in file order and the digest of what defines it."""

    path: str
    modules: tuple[LoraModule, ...]
    digest: str  # SHA-256 over a domain tag, the resolved config and every tensor's bytes
    arch: str | None = None  # the base architecture a GGUF adapter names (PEFT: not stated)

    @property
    def rank(self) -> int:
        return max(m.a.shape[0] for m in self.modules)


def pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's `get_pattern_key`: the value of the first pattern the module name ends in."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_adapter(path: str | Path) -> LoraAdapterFile:
    """A PEFT folder, or a llama.cpp GGUF adapter file (`*.gguf`)."""
    path = Path(path)
    return read_gguf_adapter(path) if path.suffix == ".gguf" and not path.is_dir() else read_peft_adapter(path)


def read_peft_adapter(folder: str | Path) -> LoraAdapterFile:
    """Read a PEFT LoRA folder. Raises AdapterError naming the file (and module) on anything
    missing, malformed or that agentkv cannot apply."""
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    config = _read_config(config_path)
    if not weights_path.is_file():
        raise AdapterError(f"{weights_path}: missing (a PEFT adapter folder needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        entries = _file_entries(weights_path)
    except FormatError as exc:
        raise AdapterError(f"{weights_path}: {exc}") from exc
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, entry in entries.items():
        found = _MODULE.match(key)
        if found is None:
            raise AdapterError(f"{weights_path}: tensor {key!r} is not a LoRA A/B weight (only LoRA is supported)")
        arr = dequantize(np.asarray(_array(entry)), int(DTYPES[entry.dtype][1])).reshape(entry.shape)
        pairs.setdefault(found["module"], {})[found["part"]] = np.ascontiguousarray(arr, dtype=np.float32)
    experts = {name: parts for name, parts in pairs.items() if is_expert_wrapper(name)}
    modules = tuple(_module(weights_path, name, parts, config) for name, parts in pairs.items() if name not in experts)
    if experts:
        modules += tuple(expert_modules(weights_path, experts, config, LoraModule))
    if not modules:
        raise AdapterError(f"{weights_path}: holds no LoRA weights")
    return LoraAdapterFile(str(folder), modules, _digest(modules))


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise AdapterError(f"{path}: missing (a PEFT adapter folder needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: expected a JSON object, got {type(config).__name__}")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"{path}: peft_type {peft_type!r} is not supported (only 'LORA')")
    for field, allowed in (("use_dora", (False, None)), ("bias", ("none", None)), ("fan_in_fan_out", (False, None))):
        if config.get(field) not in allowed:
            raise AdapterError(f"{path}: {field}={config.get(field)!r} is not supported (allowed: {allowed[0]!r})")
    if config.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save={config['modules_to_save']!r} is not supported")
    for field in ("r", "lora_alpha"):
        value = config.get(field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise AdapterError(f"{path}: {field} must be a positive number, got {value!r}")
    for field in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(field) or {}, dict):
            raise AdapterError(f"{path}: {field} must be an object, got {config.get(field)!r}")
    return config


def _module(file: Path, name: str, parts: dict[str, np.ndarray], config: dict[str, Any]) -> LoraModule:
    """One module's A/B pair, checked against each other and the config, with its scaling."""
    found = _LAYER.search(name)
    kind = KINDS.get((found["block"], found["proj"])) if found else None
    if kind is None:
        raise AdapterError(
            f"{file}: module {name!r} cannot take a LoRA adapter in agentkv (supported: the decoder layers' "
            "q/k/v/o_proj, dense mlp gate/up/down_proj, and target_parameters mlp.experts.gate_up_proj/down_proj)"
        )
    if set(parts) != {"A", "B"}:
        raise AdapterError(f"{file}: module {name!r} has lora_{'/'.join(sorted(parts))} but needs both lora_A and B")
    a, b = parts["A"], parts["B"]
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise AdapterError(
            f"{file}: module {name!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not [r, in] and [out, r]"
        )
    rank = int(pattern_value(config.get("rank_pattern") or {}, name, config["r"]))
    if rank != a.shape[0]:
        raise AdapterError(f"{file}: module {name!r}: lora_A has rank {a.shape[0]}, the config says r={rank}")
    alpha = float(pattern_value(config.get("alpha_pattern") or {}, name, config["lora_alpha"]))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraModule(name, int(found["layer"]), kind, a, b, scaling)


def _digest(modules: tuple[LoraModule, ...]) -> str:
    """What makes an adapter what it is, hashed: a domain tag, then per module (sorted) its
    layer, kind, scaling (exact, as a hex float) and its A and B bytes with their shapes.
    The config counts only through what it resolves to, so a renamed folder or a reordered
    JSON is the same adapter, and any change that changes a delta is a different one."""
    h = hashlib.sha256(b"agentkv-lora-v1\0")
    for m in sorted(modules, key=lambda m: (m.layer, m.expert, m.kind)):
        expert = f"e{m.expert}|" if m.expert >= 0 else ""  # dense modules keep their v1 bytes
        h.update(f"{m.layer}|{expert}{m.kind}|{float(m.scaling).hex()}|{list(m.a.shape)}|{list(m.b.shape)}|".encode())
        h.update(f"{m.interleaved}\0".encode())
        h.update(np.ascontiguousarray(m.a, dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(m.b, dtype="<f4").tobytes())
    return h.hexdigest()


# llama.cpp's tensor names (gguf-py's) -> projection kind
GGUF_KINDS = {
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
}
_GGUF_TENSOR = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<proj>\w+)\.weight\.lora_(?P<part>[ab])$")


def read_gguf_adapter(path: str | Path) -> LoraAdapterFile:
    """A llama.cpp LoRA adapter (`convert_lora_to_gguf.py`'s output: general.type = adapter,
    adapter.type = lora, adapter.lora.alpha, tensors `blk.N.<proj>.weight.lora_a` `[r, in]`
    and `.lora_b` `[out, r]`). llama.cpp's scaling: alpha / r (r: each module's rank), or 1
    without an alpha. A llama adapter's q/k B rows come permuted as the converter permutes
    the base's q/k weights."""
    import gguf

    from agentkv.formats.quants import dequantize as decode

    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: not a readable GGUF file: {exc}") from exc
    fields = {name: _gguf_value(field) for name, field in reader.fields.items()}
    if fields.get("general.type") != "adapter" or fields.get("adapter.type") != "lora":
        raise AdapterError(
            f"{path}: general.type={fields.get('general.type')!r} adapter.type={fields.get('adapter.type')!r}; "
            "a LoRA adapter has 'adapter' and 'lora'"
        )
    alpha = float(fields.get("adapter.lora.alpha") or 0.0)
    pairs: dict[tuple[int, str, str], dict[str, np.ndarray]] = {}
    for t in reader.tensors:
        found = _GGUF_TENSOR.match(t.name)
        kind = GGUF_KINDS.get(found["proj"]) if found else None
        if kind is None:
            raise AdapterError(f"{path}: module {t.name!r} cannot take a LoRA adapter in agentkv")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = decode(np.asarray(t.data), int(t.tensor_type)).reshape(shape)
        pairs.setdefault((int(found["layer"]), kind, t.name[: -len(".lora_a")]), {})[found["part"].upper()] = arr
    arch = fields.get("general.architecture")
    modules = tuple(
        _gguf_module(path, name, layer, kind, parts, alpha, arch == "llama")
        for (layer, kind, name), parts in pairs.items()
    )
    if not modules:
        raise AdapterError(f"{path}: holds no LoRA weights")
    return LoraAdapterFile(str(path), modules, _digest(modules), arch)


def _gguf_value(field) -> object:
    """A GGUF key's scalar or string value (None for arrays)."""
    import gguf

    if not field.types or field.types[0] == gguf.GGUFValueType.ARRAY:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0] == gguf.GGUFValueType.STRING else value.tolist()[0]


def _gguf_module(path: Path, name: str, layer: int, kind: str, parts: dict, alpha: float, llama: bool) -> LoraModule:
    if set(parts) != {"A", "B"}:
        raise AdapterError(f"{path}: module {name!r} has lora_{'/'.join(sorted(parts)).lower()} but needs both")
    a, b = (np.ascontiguousarray(parts[k], dtype=np.float32) for k in ("A", "B"))
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        raise AdapterError(
            f"{path}: module {name!r}: lora_a {list(a.shape)} and lora_b {list(b.shape)} are not [r, in] and [out, r]"
        )
    scaling = alpha / a.shape[0] if alpha else 1.0
    return LoraModule(name, layer, kind, a, b, scaling, interleaved=llama and kind in ("q", "k"))
