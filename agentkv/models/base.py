"""The model interface the runner drives: load weights through a backend, run one step."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from agentkv.formats.errors import FormatError
from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, Backend, KVSpec, Tensor, Weight


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

    def __init__(self, source: ModelSource, backend: Backend, options: LoadOptions = LoadOptions()):
        self.source, self.backend, self.options = source, backend, options
        self.hparams = source.hparams
        self.weight_formats: dict[str, int] = {}  # name -> resident qtype, for inspect/load logs

    def weight(self, name: str, required: bool = True) -> Weight | None:
        """Upload one tensor from the source; None for an absent optional tensor."""
        if not self.source.has_tensor(name):
            if required:
                raise FormatError(f"{self.source.path}: missing tensor {name!r} needed by "
                                  f"{type(self).__name__} ({self.hparams.arch})")
            return None
        info = self.source.tensor(name)
        w = self.backend.upload_weight(name, info.data, info.qtype, info.shape,
                                       resident=self.options.weights == "resident")
        self.weight_formats[name] = w.qtype
        return w

    @property
    def vocab_size(self) -> int:
        return self.hparams.vocab_size

    def kv_spec(self, num_blocks: int, block_size: int) -> KVSpec:
        hp = self.hparams
        return KVSpec(hp.num_layers, num_blocks, block_size, hp.num_kv_heads, hp.head_dim)

    @abstractmethod
    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        """Run one step over the flat batch `token_ids [n]` (rows laid out as `meta` says),
        storing their K/V into `kv`; return logits `[len(logit_rows), vocab]` for the rows asked."""


FUSED_GROUPS = (("q", "k", "v"), ("gate", "up"))


def fused_projections(backend: Backend, layer: dict, index: int) -> dict:
    """Stacks projections that read the same input (q/k/v, gate/up) where the backend fuses
    them: one matmul instead of several. Mutates `layer`: the fused weight ("q+k+v", with
    "q+k+v_bias") replaces the separate ones, so each weight is held once. The ops that take
    the stacked output (`glu`, `attention_inputs`) know its layout from the model's shapes."""
    for group in FUSED_GROUPS:
        weights = [layer[g] for g in group]
        biases = [layer.get(f"{g}_bias") for g in group]
        if any(b is None for b in biases) and any(b is not None for b in biases):
            continue
        fused = backend.fuse_rows(weights, f"blk.{index}.{'+'.join(group)}")
        fused_bias = None if biases[0] is None else backend.fuse_rows(biases, f"blk.{index}.bias")
        if fused is None or (biases[0] is not None and fused_bias is None):
            continue
        key = "+".join(group)
        layer[key], layer[key + "_bias"] = fused, fused_bias
        for g in group:
            layer[g] = layer[f"{g}_bias"] = None
    return layer
