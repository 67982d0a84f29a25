"""The model interface the runner drives: load weights through a backend, run one step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agentkv.formats.errors import FormatError
from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, Backend, KVSpec, Tensor, Weight
from agentkv.hal.blocks import AttentionWeights, DecoderLayer, DenseFFN, Projection


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How weights become resident: `resident` keeps quantized formats quantized where the
    backend has kernels for them; `f32` dequantizes everything once at load."""

    weights: str = "resident"

    def __post_init__(self):
        if self.weights not in ("resident", "f32"):
            raise ValueError(f"weights must be 'resident' or 'f32', got {self.weights!r}")


class Model(ABC):
    """A causal LM (or an encoder) written only against `hal` ops."""

    hparams: HParams
    backend: Backend
    is_embedding: bool = False
    # The family's config: reads its own keys from hparams.raw (`from_source(source)`) and
    # says what inspect reports (`summary()`).
    config_type: ClassVar[Any]

    def __init__(self, source: ModelSource, backend: Backend, options: LoadOptions = LoadOptions()):
        self.source, self.backend, self.options = source, backend, options
        self.hparams = source.hparams
        self.config = self.config_type.from_source(source)
        self.weight_formats: dict[str, int] = {}  # name -> resident qtype, for inspect/load logs

    def weight(self, name: str, required: bool = True) -> Weight | None:
        """Upload one tensor from the source; None for an absent optional tensor."""
        if not self.source.has_tensor(name):
            if required:
                raise FormatError(
                    f"{self.source.path}: missing tensor {name!r} needed by {type(self).__name__} ({self.hparams.arch})"
                )
            return None
        info = self.source.tensor(name)
        w = self.backend.upload_weight(
            name, info.data, info.qtype, info.shape, resident=self.options.weights == "resident"
        )
        self.weight_formats[name] = w.qtype
        return w

    @property
    def vocab_size(self) -> int:
        return self.hparams.vocab_size

    def kv_spec(self, num_blocks: int, block_size: int) -> KVSpec:
        hp = self.hparams
        return KVSpec(hp.num_layers, num_blocks, block_size, hp.num_kv_heads, hp.head_dim, self.backend.kv_dtype)

    # Bytes of one recurrent-state snapshot (hybrids: one per KV block); 0 without recurrent layers.
    state_bytes: int = 0

    def allocate_states(self, num_slots: int, block_size: int, every: int = 1) -> Any:
        """The recurrent-state store of a hybrid (`hal.recurrent.StateStore`); None otherwise."""
        return None

    @abstractmethod
    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        """Run one step over the flat batch `token_ids [n]` (rows laid out as `meta` says),
        storing their K/V into `kv`; return logits `[len(logit_rows), vocab]` for the rows asked."""


def attention_weights(model: Model, i: int, post_norm: bool = False, qk_norms: bool | None = None) -> AttentionWeights:
    """Layer i's attention from its canonical GGUF tensor names (`blk.{i}.attn_*`): biases
    where the file has them; q/k norms required (`qk_norms` True), absent (False) or where the
    file has them (None); the post norm when the family asks for it. q/k/v are stacked where
    the backend fuses them: one matmul instead of three, each weight held once."""
    w = lambda name, required=True: model.weight(f"blk.{i}.{name}", required)  # noqa: E731
    qk = lambda name: w(name, True) if qk_norms else w(name, False) if qk_norms is None else None  # noqa: E731
    parts = ("q", "k", "v")
    qkv = Projection(tuple(w(f"attn_{p}.weight") for p in parts), tuple(w(f"attn_{p}.bias", False) for p in parts))
    return AttentionWeights(
        norm=w("attn_norm.weight"),
        qkv=qkv.fused(model.backend, f"blk.{i}.q+k+v"),
        o=w("attn_output.weight"),
        q_norm=qk("attn_q_norm.weight"),
        k_norm=qk("attn_k_norm.weight"),
        post_norm=w("post_attention_norm.weight") if post_norm else None,
    )


def dense_ffn(model: Model, i: int, post_norm: bool = False, norm_name: str = "ffn_norm") -> DenseFFN:
    """Layer i's dense gated FFN (`blk.{i}.ffn_*`), gate|up stacked where the backend fuses;
    its input norm is `blk.{i}.{norm_name}.weight`."""
    w = lambda name: model.weight(f"blk.{i}.{name}")  # noqa: E731
    gate_up = Projection((w("ffn_gate.weight"), w("ffn_up.weight")))
    return DenseFFN(
        norm=w(f"{norm_name}.weight"),
        gate_up=gate_up.fused(model.backend, f"blk.{i}.gate+up"),
        down=w("ffn_down.weight"),
        post_norm=w("post_ffw_norm.weight") if post_norm else None,
    )


def decoder_layer(model: Model, i: int, post_norms: bool = False, qk_norms: bool | None = None) -> DecoderLayer:
    """Layer i of a pre-norm decoder with a dense FFN (gemma3 adds the post norms)."""
    return DecoderLayer(attention_weights(model, i, post_norms, qk_norms), dense_ffn(model, i, post_norms))
