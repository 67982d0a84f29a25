"""Gemma 3 text decoder (Gemma-3-270M and the text half of the larger ones): sandwich norms,
`1 + w` RMSNorm gains, per-head q/k norm, tanh-GELU gated MLP, and interleaved local
(sliding-window, own rope base) and global layers. One readable page; quantization never
appears here.

    x ─ attn_norm ─ attention ─ post_attention_norm ─(+x)─ h
    h ─ ffn_norm ─ gated MLP ─ post_ffw_norm ─(+h)─ next layer
"""
from __future__ import annotations

import math

import numpy as np

from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor
from agentkv.hal.blocks import AttentionSpec, BlockSpec, DenseFFNSpec
from agentkv.models.base import LoadOptions, Model, decoder_layer

# Gemma's RMSNorm multiplies by (1 + w). llama.cpp's converter adds the 1 to every
# `*norm.weight` when it writes a GGUF (and transformers' GGUF loader subtracts it again), so a
# GGUF gain is used as stored while a HF folder's gets the unit offset at run time.
LOCAL_ROPE_THETA = 10000.0


class Gemma3Model(Model):
    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp = self.hparams
        self.unit_offset = source.kind != "gguf"
        # Gemma rotates halves (neox) in both HF and GGUF layouts. Rope scaling, when a
        # config has it, applies to the global layers only (transformers' rope_parameters
        # keep "sliding_attention" at the default rule).
        self.rope_global = RopeSpec(dim=hp.head_dim, theta=hp.rope_theta, style=RopeStyle.NEOX,
                                    scaling=hp.rope_scaling)
        self.rope_local = RopeSpec(dim=hp.head_dim, theta=hp.rope_theta_local or LOCAL_ROPE_THETA,
                                   style=RopeStyle.NEOX)
        scale = (hp.query_pre_attn_scalar or hp.head_dim) ** -0.5
        # No attention softcap: Gemma 3 dropped it (transformers keeps the config field but
        # never passes it to attention; llama.cpp's gemma3 graph has none either).
        ffn = DenseFFNSpec("gelu_tanh")
        self.blocks = [BlockSpec(AttentionSpec(hp.num_heads, hp.num_kv_heads, hp.head_dim,
                                               self.rope_local if self._local(i) else self.rope_global, scale,
                                               hp.sliding_window if self._local(i) else None, hp.norm_eps,
                                               self.unit_offset), ffn) for i in range(hp.num_layers)]
        # transformers multiplies the embedding rows by sqrt(hidden) cast to the activation
        # dtype (float32 here): np.float32 inside backend.scale rounds it the same way.
        self.embed_scale = math.sqrt(hp.hidden_size)
        self.embed = self.weight("token_embd.weight")
        self.layers = [decoder_layer(self, i, post_norms=True, qk_norms=True) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    def _norm(self, x: Tensor, weight) -> Tensor:
        return self.backend.rms_norm(x, weight, self.hparams.norm_eps, unit_offset=self.unit_offset)

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be, hp = self.backend, self.hparams
        h = be.scale(be.embedding(self.embed, token_ids), self.embed_scale)  # [n, d]
        x = self._norm(h, self.layers[0].attention.norm)
        for i, layer in enumerate(self.layers):
            # sandwich norms: each residual add is h + post_norm(delta), then the next norm
            # (ffn_norm; the next layer's attn_norm; the final norm after the last layer)
            next_norm = self.layers[i + 1].attention.norm if i + 1 < len(self.layers) else self.norm
            h, x = be.decoder_block(h, x, layer, self.blocks[i], meta, kv, i, next_norm)
        logits = be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]
        if hp.final_logit_softcap:
            logits = be.softcap(logits, hp.final_logit_softcap)
        return logits

    def _local(self, i: int) -> bool:
        """Whether layer i is a sliding-window (local) layer."""
        hp = self.hparams
        return bool(hp.sliding_window and hp.sliding_window_layers and hp.sliding_window_layers[i])
