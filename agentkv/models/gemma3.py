"""Gemma 3 text decoder (Gemma-3-270M and the text half of the larger ones): sandwich norms,
`1 + w` RMSNorm gains, per-head q/k norm, tanh-GELU gated MLP, and interleaved local
(sliding-window, own rope base) and global layers. One readable page; quantization never
appears here.

    x ─ attn_norm ─ attention ─ post_attention_norm ─(+x)─ h
    h ─ ffn_norm ─ gated MLP ─ post_ffw_norm ─(+h)─ next layer
"""

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
from agentkv.models.config import SourceKeys, layer_letters, opt_float, sliding_layers

# Gemma's RMSNorm multiplies by (1 + w). llama.cpp's converter adds the 1 to every
# `*norm.weight` when it writes a GGUF (and transformers' GGUF loader subtracts it again), so a
# GGUF gain is used as stored while a HF folder's gets the unit offset at run time.
LOCAL_ROPE_THETA = 10000.0
# llama.cpp's converter writes neither the local rope base nor the layer pattern of a gemma3
# GGUF; llama.cpp hard-codes both (llama-model.cpp, LLM_ARCH_GEMMA3), and so do we.
SWA_PERIOD = 6


def _local_rope_theta(keys: SourceKeys) -> float | None:
    """The rope base of the sliding-window layers, where the file states one."""
    if keys.gguf:
        return float(keys.get("rope.freq_base_swa", None, LOCAL_ROPE_THETA))
    params = keys.raw.get("rope_parameters")
    if isinstance(params, dict):  # transformers>=5: per layer type
        return opt_float((params.get("sliding_attention") or {}).get("rope_theta"))
    return opt_float(keys.raw.get("rope_local_base_freq"))


@dataclass(frozen=True, slots=True)
class Gemma3Config:
    """Gemma 3's own knowledge on top of the shared hparams: local/global layers and the local
    rope base, the query scale, the logit softcaps and the `1 + w` norm gains."""

    hparams: HParams
    unit_offset: bool  # HF gains are w (applied as 1 + w); a GGUF's already hold the 1
    sliding_window: int | None = None
    sliding_window_layers: tuple[bool, ...] | None = None
    rope_theta_local: float | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None

    @classmethod
    def from_source(cls, source: ModelSource) -> Gemma3Config:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> Gemma3Config:
        """From the file's shared hparams and raw keys (`SourceKeys(hparams, kind, path)`)."""
        hp = keys.hparams
        window, layers = sliding_layers(keys, keys.get("attention.sliding_window", "sliding_window"), SWA_PERIOD)
        # llama.cpp scales gemma3 queries by 1/sqrt(key_length) (the 270M..12B configs agree).
        scalar = float(hp.head_dim) if keys.gguf else opt_float(keys.raw.get("query_pre_attn_scalar"))
        return cls(
            hp,
            unit_offset=not keys.gguf,
            sliding_window=window,
            sliding_window_layers=layers,
            rope_theta_local=_local_rope_theta(keys),
            query_pre_attn_scalar=scalar,
            attn_logit_softcap=opt_float(keys.get("attn_logit_softcapping", "attn_logit_softcapping")),
            final_logit_softcap=opt_float(keys.get("final_logit_softcapping", "final_logit_softcapping")),
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports."""
        return {
            "rope_theta_local": self.rope_theta_local,
            "sliding_window": self.sliding_window,
            "attn_logit_softcap": self.attn_logit_softcap,
            "final_logit_softcap": self.final_logit_softcap,
            "query_pre_attn_scalar": self.query_pre_attn_scalar,
            "sliding_window_layers": layer_letters(self.sliding_window_layers),
        }


class Gemma3Model(Model):
    config_type = Gemma3Config
    supports_lora = True  # runtime/adapters.py attaches adapters to its projections

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp, cfg = self.hparams, self.config
        self.unit_offset = cfg.unit_offset
        # Gemma rotates halves (neox) in both HF and GGUF layouts. Rope scaling, when a
        # config has it, applies to the global layers only (transformers' rope_parameters
        # keep "sliding_attention" at the default rule).
        self.rope_global = RopeSpec(dim=hp.head_dim, theta=hp.rope_theta, style=RopeStyle.NEOX, scaling=hp.rope_scaling)
        self.rope_local = RopeSpec(
            dim=hp.head_dim, theta=cfg.rope_theta_local or LOCAL_ROPE_THETA, style=RopeStyle.NEOX
        )
        scale = (cfg.query_pre_attn_scalar or hp.head_dim) ** -0.5
        # No attention softcap: Gemma 3 dropped it (transformers keeps the config field but
        # never passes it to attention; llama.cpp's gemma3 graph has none either).
        ffn = DenseFFNSpec("gelu_tanh")
        self.blocks = [
            BlockSpec(
                AttentionSpec(
                    hp.num_heads,
                    hp.num_kv_heads,
                    hp.head_dim,
                    self.rope_local if self._local(i) else self.rope_global,
                    scale,
                    cfg.sliding_window if self._local(i) else None,
                    hp.norm_eps,
                    self.unit_offset,
                ),
                ffn,
            )
            for i in range(hp.num_layers)
        ]
        # transformers multiplies the embedding rows by sqrt(hidden) cast to the activation
        # dtype (float32 here): np.float32 inside backend.scale rounds it the same way.
        self.embed_scale = math.sqrt(hp.hidden_size)
        self.embed = self.weight("token_embd.weight")
        self.layers = [decoder_layer(self, i, post_norms=True, qk_norms=True) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    def _norm(self, x: Tensor, weight) -> Tensor:
        return self.backend.rms_norm(x, weight, self.hparams.norm_eps, unit_offset=self.unit_offset)

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray, lora=None) -> Tensor:
        """`lora` (a hal.lora.LoraStep): the step's per-row adapters, added to the projections."""
        be, cfg = self.backend, self.config
        h = be.scale(be.embedding(self.embed, token_ids), self.embed_scale)  # [n, d]
        x = self._norm(h, self.layers[0].attention.norm)
        # sandwich norms: each residual add is h + post_norm(delta), then the next norm
        blocks = be if lora is None else LoraView(be, lora)
        h, x = blocks.decoder_blocks(h, x, self.layers, self.blocks, meta, kv, self.norm)
        logits = be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]
        if cfg.final_logit_softcap:
            logits = be.softcap(logits, cfg.final_logit_softcap)
        return logits

    def _local(self, i: int) -> bool:
        """Whether layer i is a sliding-window (local) layer."""
        cfg = self.config
        return bool(cfg.sliding_window and cfg.sliding_window_layers[i])
