"""Model registry keyed by canonical (GGUF) architecture name."""

from __future__ import annotations

import importlib
from typing import Any

from agentkv.formats.source import ModelSource
from agentkv.hal.base import Backend
from agentkv.models.base import LoadOptions, Model


class UnsupportedArchitecture(ValueError):
    """An architecture no model family here implements."""


_FAMILIES: dict[str, str] = {
    "llama": "agentkv.models.llama:LlamaModel",
    "mistral": "agentkv.models.llama:LlamaModel",
    "qwen2": "agentkv.models.llama:LlamaModel",
    "qwen3": "agentkv.models.llama:LlamaModel",
    "qwen3-embedding": "agentkv.models.qwen3_embedding:Qwen3EmbeddingModel",  # qwen3 pooled (see family_of)
    "gemma3": "agentkv.models.gemma3:Gemma3Model",
    "bert": "agentkv.models.bert:BertModel",
    "qwen2moe": "agentkv.models.moe:MoEModel",
    "qwen3moe": "agentkv.models.moe:MoEModel",
    "olmoe": "agentkv.models.moe:MoEModel",
    "mixtral": "agentkv.models.moe:MoEModel",  # arch `llama` with experts (see family_of)
    "gpt-oss": "agentkv.models.gpt_oss:GptOssModel",
    "glm4moe": "agentkv.models.moe:MoEModel",
    "deepseek2": "agentkv.models.deepseek:DeepseekModel",  # DeepSeek-V2/V3, Kimi-K2, Moonlight (MLA)
    "qwen3next": "agentkv.models.qwen3next:HybridModel",
    "qwen35": "agentkv.models.qwen3next:HybridModel",
    "qwen35moe": "agentkv.models.qwen3next:HybridModel",
    "granitehybrid": "agentkv.models.granite_hybrid:GraniteHybridModel",  # Granite-4.0-H (Mamba-2)
}


def supported() -> list[str]:
    return sorted(_FAMILIES)


def model_class(arch: str) -> type[Model]:
    if arch not in _FAMILIES:
        raise UnsupportedArchitecture(f"architecture {arch!r} is not supported; supported: {', '.join(supported())}")
    module_name, attr = _FAMILIES[arch].split(":")
    return getattr(importlib.import_module(module_name), attr)


def family_of(source: ModelSource) -> str:
    """The family key of a source: its architecture, except that a `llama` with experts (a
    GGUF's `llama.expert_count` > 0, or a HF mixtral folder) is `mixtral`, and a `qwen3` pooled
    by its last token (a folder's 1_Pooling, a GGUF's `qwen3.pooling_type` 3) is
    `qwen3-embedding`."""
    hp = source.hparams
    if hp.arch == "llama" and ((hp.raw.get("llama.expert_count") or 0) > 0 or hp.raw.get("model_type") == "mixtral"):
        return "mixtral"
    pooled = (hp.raw.get("pooling_config") or {}).get("pooling_mode_lasttoken") or hp.raw.get("qwen3.pooling_type") == 3
    if hp.arch == "qwen3" and pooled:
        return "qwen3-embedding"
    return hp.arch


def family_config(source: ModelSource) -> Any:
    """The source's family config (`LlamaConfig`, `Gemma3Config`, ...): the family's own keys
    read from the file with its defaults applied. Raises UnsupportedArchitecture."""
    return model_class(family_of(source)).config_type.from_source(source)


def load_model(source: ModelSource, backend: Backend, options: LoadOptions = LoadOptions()) -> Model:
    return model_class(family_of(source))(source, backend, options)
