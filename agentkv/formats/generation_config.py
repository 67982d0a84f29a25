"""The sampling defaults a model ships: HF `generation_config.json` beside a safetensors
folder's weights. GGUF files carry none (no key of the format holds sampling defaults), so a
GGUF model has no defaults and requests fall back to the engine's own."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentkv.formats.errors import FormatError

FILE_NAME = "generation_config.json"
# The keys a server may apply as request defaults (vLLM's set, in SamplingParams' names).
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def read_generation_config(path: str | Path) -> dict[str, Any]:
    """Sampling defaults from `path/generation_config.json`: only the SAMPLING_KEYS it sets
    to numbers; {} for a GGUF file or a folder without the file. A file that is not a JSON
    object, or a value that is not a finite number, raises FormatError naming it."""
    folder = Path(path)
    file = folder / FILE_NAME
    if not folder.is_dir() or not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(f"{file}: cannot read the generation config: {exc}") from exc
    if not isinstance(config, dict):
        raise FormatError(f"{file}: the generation config is not a JSON object")
    out: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise FormatError(f"{file}: {key}={value!r} is not a finite number")
        out[key] = value
    return out
