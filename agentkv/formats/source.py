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
    """The hyper-parameters every family shares, as the file states them (GGUF `<arch>.*` keys
    or config.json), plus the raw metadata they came from. Family knowledge (gemma's local
    layers and query scale, BERT pooling, rope dims, ...) is read from `raw` by the family's
    own config in models/, never here."""

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
    tie_embeddings: bool = False  # True when the file has no output.weight
    # GGUF key/values, or config.json (its text half for multimodal configs, with
    # 1_Pooling/config.json under "pooling_config" where the folder has one)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


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
