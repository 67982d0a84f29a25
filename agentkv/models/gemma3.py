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
from agentkv.models.base import LoadOptions, Model, fused_projections, project

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
        self.scale = (hp.query_pre_attn_scalar or hp.head_dim) ** -0.5
        # transformers multiplies the embedding rows by sqrt(hidden) cast to the activation
        # dtype (float32 here): np.float32 inside backend.scale rounds it the same way.
        self.embed_scale = math.sqrt(hp.hidden_size)
        self.embed = self.weight("token_embd.weight")
        self.layers = [self._layer(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    def _layer(self, i: int) -> dict:
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        layer = {
            "attn_norm": w("attn_norm.weight"),
            "q": w("attn_q.weight"), "k": w("attn_k.weight"), "v": w("attn_v.weight"),
            "q_norm": w("attn_q_norm.weight"), "k_norm": w("attn_k_norm.weight"),
            "o": w("attn_output.weight"),
            "post_attn_norm": w("post_attention_norm.weight"),
            "ffn_norm": w("ffn_norm.weight"),
            "gate": w("ffn_gate.weight"), "up": w("ffn_up.weight"), "down": w("ffn_down.weight"),
            "post_ffn_norm": w("post_ffw_norm.weight"),
        }
        return fused_projections(self.backend, layer, i)

    def _norm(self, x: Tensor, weight) -> Tensor:
        return self.backend.rms_norm(x, weight, self.hparams.norm_eps, unit_offset=self.unit_offset)

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be, hp = self.backend, self.hparams
        h = be.scale(be.embedding(self.embed, token_ids), self.embed_scale)  # [n, d]
        for i, layer in enumerate(self.layers):
            attn = self._attention(i, layer, self._norm(h, layer["attn_norm"]), meta, kv)
            h = be.add(h, self._norm(attn, layer["post_attn_norm"]))
            x = self._norm(h, layer["ffn_norm"])
            act = be.gated_act(*project(be, x, layer, ("gate", "up")), "gelu_tanh")
            h = be.add(h, self._norm(be.matmul(act, layer["down"]), layer["post_ffn_norm"]))
        h = self._norm(be.take_rows(h, logit_rows), self.norm)
        logits = be.matmul(h, self.head)  # [rows, vocab]
        if hp.final_logit_softcap:
            logits = be.softcap(logits, hp.final_logit_softcap)
        return logits

    def _attention(self, i: int, layer: dict, x: Tensor, meta: AttnMeta, kv) -> Tensor:
        be, hp = self.backend, self.hparams
        n, hd = meta.num_tokens, hp.head_dim
        q, k, v = project(be, x, layer, ("q", "k", "v"))
        q = self._norm(be.reshape(q, (n, hp.num_heads, hd)), layer["q_norm"])
        k = self._norm(be.reshape(k, (n, hp.num_kv_heads, hd)), layer["k_norm"])
        v = be.reshape(v, (n, hp.num_kv_heads, hd))
        local = self._local(i)
        rope = self.rope_local if local else self.rope_global
        q, k = be.rope(q, meta.positions, rope), be.rope(k, meta.positions, rope)
        be.kv_store(kv, i, k, v, meta.slot_mapping)
        # No attention softcap: Gemma 3 dropped it (transformers keeps the config field but
        # never passes it to attention; llama.cpp's gemma3 graph has none either).
        out = be.attention(q, kv, i, meta, self.scale, window=hp.sliding_window if local else None)
        return be.matmul(be.reshape(out, (n, hp.num_heads * hd)), layer["o"])

    def _local(self, i: int) -> bool:
        """Whether layer i is a sliding-window (local) layer."""
        hp = self.hparams
        return bool(hp.sliding_window and hp.sliding_window_layers and hp.sliding_window_layers[i])
