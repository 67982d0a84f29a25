"""The tensor-source interface every reader (GGUF, safetensors) implements, and model hparams.

Tensor names are canonical GGUF names everywhere (`token_embd.weight`, `blk.3.attn_q.weight`,
`output_norm.weight`); the safetensors reader maps HF names onto them with gguf-py's
`TensorNameMap`. Shapes are numpy order (rows first): a linear weight is `[out, in]`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np


class TensorInfo(NamedTuple):
    """One stored tensor. `data` is the raw bytes for quantized types (uint8, one row of blocks
    per row of the logical tensor: shape `[*shape[:-1], bytes_per_row]`) and a typed array
    (float32/float16/bfloat16-as-uint16) for plain types. Memory-mapped, never copied."""

    name: str
    shape: tuple[int, ...]
    qtype: int  # gguf.GGMLQuantizationType value
    data: np.ndarray

    @property
    def num_bytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True, slots=True)
class HParams:
    """Architecture hyper-parameters, normalised from GGUF `<arch>.*` keys or config.json.

    Per-layer values (gemma3's sliding window pattern) are tuples with one entry per layer."""

    arch: str  # canonical GGUF architecture name: llama, qwen2, qwen3, gemma3, bert, ...
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int
    norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"type": "llama3"|"linear"|"yarn", ...}
    rope_theta_local: float | None = None  # gemma3: rope base of sliding-window layers
    sliding_window: int | None = None
    sliding_window_layers: tuple[bool, ...] | None = None  # True where a layer uses the window
    tie_embeddings: bool = False  # True when the file has no output.weight
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    pooling: str | None = None  # embedding models: "mean" | "cls" | "last"
    extra: dict[str, Any] = field(default_factory=dict)


class ModelSource(ABC):
    """A model on disk: hparams, tensors, and what the tokenizer/chat template need.

    Readers are cheap to open (metadata only); tensor data is memory-mapped on access."""

    path: Path
    metadata: dict[str, Any]  # GGUF key/values, or config.json (+ tokenizer_config.json)

    @property
    @abstractmethod
    def hparams(self) -> HParams: ...

    @abstractmethod
    def tensor_names(self) -> list[str]: ...

    @abstractmethod
    def tensor(self, name: str) -> TensorInfo:
        """The named tensor; raises FormatError naming the file and tensor if absent."""

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_names()

    def dequantized(self, name: str) -> np.ndarray:
        """The named tensor as float32 in its logical shape (a copy)."""
        from agentkv.formats.quants import dequantize

        info = self.tensor(name)
        return dequantize(info.data, info.qtype).reshape(info.shape).astype(np.float32, copy=False)

    @property
    def kind(self) -> str:
        """'gguf' or 'safetensors'."""
        return type(self).__name__.lower().replace("source", "")
