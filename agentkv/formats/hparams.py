"""HParams from GGUF `<arch>.*` metadata or a HF config.json, one reader per source.

Only the fields every family shares are read here; a family's own keys (and their
defaults) are read from `HParams.raw` by that family's config in models/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentkv.formats.errors import GGUFError, SafetensorsError
from agentkv.formats.source import HParams

# config.json model_type -> canonical GGUF architecture name.
HF_ARCH = {
    "llama": "llama",
    "mistral": "llama",  # llama.cpp converts mistral to arch `llama`
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "bert": "bert",
    "xlm-roberta": "bert",  # llama.cpp converts XLM-RoBERTa (BGE-M3, BGE-reranker) to arch `bert`
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "mixtral": "llama",  # llama.cpp converts mixtral to arch `llama` with expert_count > 0
    "olmoe": "olmoe",
    "gpt_oss": "gpt-oss",
    "glm4_moe": "glm4moe",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",  # llama.cpp converts V3 (Kimi-K2, Moonlight) to arch `deepseek2`
    "deepseek_v32": "deepseek2",  # V3 with sparse attention (its indexer keeps its HF names)
    "qwen3_next": "qwen3next",
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe_text": "qwen35moe",
    "granitemoehybrid": "granitehybrid",
}


# ---------------------------------------------------------------------------------- GGUF


class _GGUFKeys:
    """Typed access to `<arch>.*` keys, raising GGUFError naming the key and file."""

    def __init__(self, metadata: dict[str, Any], arch: str, path: Path) -> None:
        self.md, self.arch, self.path = metadata, arch, path

    def get(self, suffix: str, default: Any = None) -> Any:
        return self.md.get(f"{self.arch}.{suffix}", default)

    def need(self, suffix: str) -> Any:
        key = f"{self.arch}.{suffix}"
        if key not in self.md:
            raise GGUFError(f"{self.path}: missing required hparam key {key!r}")
        return self.md[key]

    def need_int(self, suffix: str) -> int:
        value = self.need(suffix)
        if isinstance(value, list):  # per-layer arrays (e.g. feed_forward_length): take the max
            value = max(value) if value else 0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise GGUFError(f"{self.path}: key {self.arch}.{suffix} = {value!r}, expected a positive int")
        return int(value)


def _gguf_rope_scaling(keys: _GGUFKeys) -> dict[str, Any] | None:
    kind = keys.get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"type": kind}
    for suffix, name in (
        ("rope.scaling.factor", "factor"),
        ("rope.scaling.original_context_length", "original_context_length"),
        ("rope.scaling.attn_factor", "attn_factor"),
        ("rope.scaling.yarn_beta_fast", "beta_fast"),
        ("rope.scaling.yarn_beta_slow", "beta_slow"),
        ("rope.scaling.yarn_log_multiplier", "mscale_all_dim"),
    ):
        if keys.get(suffix) is not None:
            scaling[name] = keys.get(suffix)
    return scaling


def _gguf_vocab_size(keys: _GGUFKeys, metadata: dict[str, Any]) -> int:
    if keys.get("vocab_size") is not None:
        return keys.need_int("vocab_size")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(
            f"{keys.path}: missing required hparam key {keys.arch}.vocab_size (and no tokenizer.ggml.tokens to count)"
        )
    return len(tokens)


def hparams_from_gguf(metadata: dict[str, Any], path: Path, tensor_names: list[str]) -> HParams:
    """Normalise `<arch>.*` keys; raises GGUFError naming the missing/bad key and the file."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: missing required hparam key 'general.architecture'")
    keys = _GGUFKeys(metadata, arch, Path(path))
    hidden = keys.need_int("embedding_length")
    num_heads = keys.need_int("attention.head_count")
    # llama.cpp counts multi-token-prediction layers (GLM-4.5, DeepSeek) into block_count; they
    # come last and are not part of the decoder a token runs through
    num_layers = keys.need_int("block_count") - int(keys.get("nextn_predict_layers", 0) or 0)
    num_kv = keys.get("attention.head_count_kv", num_heads)
    if isinstance(num_kv, list):
        num_kv = max(num_kv)
    head_dim = int(keys.get("attention.key_length") or hidden // num_heads)
    eps = keys.get("attention.layer_norm_rms_epsilon", keys.get("attention.layer_norm_epsilon"))
    if eps is None:
        keys.need("attention.layer_norm_rms_epsilon")
    return HParams(
        arch=arch,
        vocab_size=_gguf_vocab_size(keys, metadata),
        hidden_size=hidden,
        intermediate_size=keys.need_int("feed_forward_length"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(num_kv),
        head_dim=head_dim,
        context_len=keys.need_int("context_length"),
        norm_eps=float(eps),
        rope_theta=float(keys.get("rope.freq_base", 10000.0)),
        rope_scaling=_gguf_rope_scaling(keys),
        tie_embeddings="output.weight" not in tensor_names,
        raw=metadata,
    )


# ---------------------------------------------------------------------------- config.json


def _need(config: dict[str, Any], key: str, path: Path) -> Any:
    if config.get(key) is None:
        raise SafetensorsError(f"{path}: config.json is missing required hparam key {key!r}")
    return config[key]


def _rope_params(config: dict[str, Any]) -> dict[str, Any]:
    """The (full-attention) rope dict from transformers>=5 `rope_parameters` or older keys."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        return params["full_attention"]
    if isinstance(params, dict):
        return params
    merged = dict(config.get("rope_scaling") or {})
    if config.get("rope_theta") is not None:
        merged["rope_theta"] = config["rope_theta"]
    return merged


def _config_rope_scaling(rope: dict[str, Any]) -> dict[str, Any] | None:
    kind = rope.get("rope_type", rope.get("type"))
    if kind in (None, "default"):
        return None
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type", "type")}
    return {"type": kind, **scaling}


def _pooling_config(folder: Path) -> dict[str, Any] | None:
    """A sentence-transformers folder's 1_Pooling/config.json, as it is; None without one."""
    pooling_file = folder / "1_Pooling" / "config.json"
    if not pooling_file.is_file():
        return None
    try:
        return json.loads(pooling_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{pooling_file}: cannot read pooling config: {exc}") from exc


def hparams_from_config(config: dict[str, Any], path: Path) -> HParams:
    """Normalise a HF config.json (path: the model folder, for 1_Pooling/ and error messages)."""
    path = Path(path)
    if isinstance(config.get("text_config"), dict):  # multimodal gemma3: the text half
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "gemma3")}
    model_type = _need(config, "model_type", path)
    if model_type not in HF_ARCH:
        raise SafetensorsError(
            f"{path}: config.json model_type {model_type!r} is not supported (supported: {', '.join(sorted(HF_ARCH))})"
        )
    arch = HF_ARCH[model_type]
    hidden = int(_need(config, "hidden_size", path))
    num_heads = int(_need(config, "num_attention_heads", path))
    num_layers = int(_need(config, "num_hidden_layers", path))
    rope = _rope_params(config)
    pooling = _pooling_config(path)
    eps_key = "layer_norm_eps" if arch == "bert" else "rms_norm_eps"
    return HParams(
        arch=arch,
        vocab_size=int(_need(config, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=int(_need(config, "intermediate_size", path)),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads),
        context_len=int(_need(config, "max_position_embeddings", path)),
        norm_eps=float(_need(config, eps_key, path)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=_config_rope_scaling(rope),
        tie_embeddings=bool(config.get("tie_word_embeddings", arch in ("gemma3", "bert"))),
        raw=config if pooling is None else {**config, "pooling_config": pooling},
    )


__all__ = ["hparams_from_gguf", "hparams_from_config", "HF_ARCH"]
