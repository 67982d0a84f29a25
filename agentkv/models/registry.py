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
    "gemma3": "agentkv.models.gemma3:Gemma3Model",
    "bert": "agentkv.models.bert:BertModel",
}


def supported() -> list[str]:
    return sorted(_FAMILIES)


def model_class(arch: str) -> type[Model]:
    if arch not in _FAMILIES:
        raise UnsupportedArchitecture(
            f"architecture {arch!r} is not supported; supported: {', '.join(supported())}")
    module_name, attr = _FAMILIES[arch].split(":")
    return getattr(importlib.import_module(module_name), attr)


def family_config(source: ModelSource) -> Any:
    """The source's family config (`LlamaConfig`, `Gemma3Config`, ...): the family's own keys
    read from the file with its defaults applied. Raises UnsupportedArchitecture."""
    return model_class(source.hparams.arch).config_type.from_source(source)


def load_model(source: ModelSource, backend: Backend, options: LoadOptions = LoadOptions()) -> Model:
    return model_class(source.hparams.arch)(source, backend, options)
