"""What the family configs share: reading a family's own keys from `HParams.raw`.

formats/ reads only the fields every family has; each family's config (`LlamaConfig`,
`Gemma3Config`, `BertConfig`) reads its extra keys here and applies its own defaults.
Errors name the file and the key, as the readers' do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentkv.formats.errors import FormatError, GGUFError, SafetensorsError
from agentkv.formats.source import HParams, ModelSource


class SourceKeys:
    """A family's view of its source's raw metadata: `<arch>.*` GGUF keys or config.json keys."""

    def __init__(self, hparams: HParams, kind: str, path: Path | str) -> None:
        """`kind` is the source's ("gguf" or "safetensors"), `path` its file or folder."""
        self.hparams, self.kind, self.path = hparams, kind, Path(path)
        self.arch, self.raw = hparams.arch, hparams.raw
        self.num_layers = hparams.num_layers

    @classmethod
    def of(cls, source: ModelSource) -> SourceKeys:
        return cls(source.hparams, source.kind, source.path)

    @property
    def gguf(self) -> bool:
        return self.kind == "gguf"

    def get(self, gguf_suffix: str | None, config_key: str | None, default: Any = None) -> Any:
        """The GGUF key `<arch>.<gguf_suffix>` or the config.json key, whichever this source has."""
        key = f"{self.arch}.{gguf_suffix}" if self.gguf else config_key
        if key is None:
            return default
        value = self.raw.get(key)
        return default if value is None else value

    def error(self, message: str) -> FormatError:
        """The reader's own error type, naming the file (config.json for a folder)."""
        if self.gguf:
            return GGUFError(f"{self.path}: {message}")
        return SafetensorsError(f"{self.path}: config.json {message}")


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def periodic_layers(num_layers: int, period: int) -> tuple[bool, ...]:
    """Layer i uses the sliding window unless (i + 1) % period == 0 (every period-th is global)."""
    return tuple((i + 1) % period != 0 for i in range(num_layers))


def sliding_layers(
    keys: SourceKeys, window: int | None, period: int | None
) -> tuple[int | None, tuple[bool, ...] | None]:
    """(window, which layers slide) from the file's per-layer pattern where it has one; else
    every `period`-th layer global (a family default), or, with no period, every layer slides."""
    if not window:
        return None, None
    n = keys.num_layers
    if keys.gguf:
        pattern = keys.get("attention.sliding_window_pattern", None)
        if isinstance(pattern, list):
            if len(pattern) != n:
                raise keys.error(
                    f"{keys.arch}.attention.sliding_window_pattern has {len(pattern)} entries, expected block_count={n}"
                )
            return int(window), tuple(bool(p) for p in pattern)
        if isinstance(pattern, int) and pattern > 0:
            return int(window), periodic_layers(n, pattern)
    else:
        layer_types = keys.raw.get("layer_types")
        if layer_types:
            return int(window), tuple(t == "sliding_attention" for t in layer_types)
        hf_period = keys.raw.get("sliding_window_pattern", keys.raw.get("_sliding_window_pattern"))
        if period is not None and hf_period:
            return int(window), periodic_layers(n, int(hf_period))
    return int(window), periodic_layers(n, period) if period else (True,) * n


def layer_letters(layers: tuple[bool, ...] | None) -> str | None:
    """`S`/`G` per layer (sliding or global), as `agentkv inspect` prints the pattern."""
    return None if layers is None else "".join("S" if s else "G" for s in layers)
