"""Llama-family decoder: Llama 2/3 (SmolLM2), Mistral (sliding window), Qwen2 (qkv bias),
Qwen3 (per-head q/k RMSNorm). One readable page; quantization never appears here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor
from agentkv.hal.blocks import AttentionSpec, BlockSpec, DenseFFNSpec
from agentkv.hal.lora import LoraView
from agentkv.models.base import LoadOptions, Model, decoder_layer
from agentkv.models.config import SourceKeys, layer_letters, sliding_layers
from agentkv.models.rank_head import check_rank_head


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The llama family's own knowledge on top of the shared hparams: rotated dims, the q/k
    row layout, and which layers slide (mistral: all; qwen2: only with use_sliding_window)."""

    hparams: HParams
    rope_dim: int
    interleaved: bool  # GGUF llama/mistral: llama.cpp's converter permuted q/k rows
    sliding_window: int | None = None
    sliding_window_layers: tuple[bool, ...] | None = None

    @classmethod
    def from_source(cls, source: ModelSource) -> LlamaConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> LlamaConfig:
        """From the file's shared hparams and raw keys (`SourceKeys(hparams, kind, path)`)."""
        hp = keys.hparams
        window = keys.get("attention.sliding_window", "sliding_window")
        if keys.raw.get("model_type") == "qwen2" and not keys.raw.get("use_sliding_window"):
            window = None  # Qwen2 configs carry a window they do not use unless told to
        window, layers = sliding_layers(keys, window, period=None)
        return cls(
            hp,
            rope_dim=int(keys.get("rope.dimension_count", None, hp.head_dim)),
            interleaved=keys.gguf and hp.arch in ("llama", "mistral"),
            sliding_window=window,
            sliding_window_layers=layers,
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports."""
        return {
            "sliding_window": self.sliding_window,
            "sliding_window_layers": layer_letters(self.sliding_window_layers),
        }


class LlamaModel(Model):
    config_type = LlamaConfig
    supports_lora = True  # runtime/adapters.py attaches adapters to its projections

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp, cfg = self.hparams, self.config
        # llama.cpp's converter permutes GGUF llama q/k rows so that rope pairs are adjacent
        # (interleaved); HF weights and GGUF qwen keep the halves (neox) layout.
        self.rope = RopeSpec(
            dim=cfg.rope_dim,
            theta=hp.rope_theta,
            style=RopeStyle.INTERLEAVED if cfg.interleaved else RopeStyle.NEOX,
            scaling=self._rope_scaling(source),
        )
        scale = 1.0 / math.sqrt(hp.head_dim)
        ffn = DenseFFNSpec("silu")
        self.blocks = [
            BlockSpec(
                AttentionSpec(
                    hp.num_heads,
                    hp.num_kv_heads,
                    hp.head_dim,
                    self.rope,
                    scale,
                    cfg.sliding_window if self._windowed(i) else None,
                    hp.norm_eps,
                ),
                ffn,
            )
            for i in range(hp.num_layers)
        ]
        self.token_embd = self.weight("token_embd.weight")
        self.layers = [decoder_layer(self, i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.token_embd if hp.tie_embeddings else self.weight("output.weight")
        check_rank_head(source)  # llama.cpp's Qwen3-Reranker layout: its head must be token_embd

    @staticmethod
    def _rope_scaling(source) -> dict | None:
        """Llama 3.x GGUFs carry their rope scaling as per-pair frequency divisors."""
        if source.has_tensor("rope_freqs.weight"):
            factors = source.dequantized("rope_freqs.weight").ravel()
            return {"type": "factors", "factors": tuple(float(f) for f in factors)}
        return source.hparams.rope_scaling

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray, lora=None) -> Tensor:
        """`lora` (a hal.lora.LoraStep): the step's per-row adapters, added to the projections."""
        be = self.backend
        h = be.embedding(self.token_embd, token_ids)  # [n, d]
        x = be.rms_norm(h, self.layers[0].attention.norm, self.hparams.norm_eps)
        if lora is None:
            h, x = be.decoder_blocks(h, x, self.layers, self.blocks, meta, kv, self.norm)
        else:
            h, x = LoraView(be, lora).decoder_blocks(h, x, self.layers, self.blocks, meta, kv, self.norm)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]

    def _windowed(self, i: int) -> bool:
        cfg = self.config
        return bool(cfg.sliding_window and cfg.sliding_window_layers[i])
