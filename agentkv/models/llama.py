"""Llama-family decoder: Llama 2/3 (SmolLM2), Mistral (sliding window), Qwen2 (qkv bias),
Qwen3 (per-head q/k RMSNorm). One readable page; quantization never appears here."""
from __future__ import annotations

import math

import numpy as np

from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor
from agentkv.models.base import LoadOptions, Model, fused_projections, project


class LlamaModel(Model):
    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp = self.hparams
        # llama.cpp's converter permutes GGUF llama q/k rows so that rope pairs are adjacent
        # (interleaved); HF weights and GGUF qwen keep the halves (neox) layout.
        interleaved = source.kind == "gguf" and hp.arch in ("llama", "mistral")
        self.rope = RopeSpec(dim=int(hp.extra.get("rope_dim", hp.head_dim)), theta=hp.rope_theta,
                             style=RopeStyle.INTERLEAVED if interleaved else RopeStyle.NEOX,
                             scaling=self._rope_scaling(source))
        self.scale = 1.0 / math.sqrt(hp.head_dim)
        self.embed = self.weight("token_embd.weight")
        self.layers = [self._layer(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    @staticmethod
    def _rope_scaling(source) -> dict | None:
        """Llama 3.x GGUFs carry their rope scaling as per-pair frequency divisors."""
        if source.has_tensor("rope_freqs.weight"):
            factors = source.dequantized("rope_freqs.weight").ravel()
            return {"type": "factors", "factors": tuple(float(f) for f in factors)}
        return source.hparams.rope_scaling

    def _layer(self, i: int) -> dict:
        w = lambda name, required=True: self.weight(f"blk.{i}.{name}", required)  # noqa: E731
        layer = {
            "attn_norm": w("attn_norm.weight"),
            "q": w("attn_q.weight"), "k": w("attn_k.weight"), "v": w("attn_v.weight"),
            "q_bias": w("attn_q.bias", False), "k_bias": w("attn_k.bias", False),
            "v_bias": w("attn_v.bias", False),
            "q_norm": w("attn_q_norm.weight", False), "k_norm": w("attn_k_norm.weight", False),
            "o": w("attn_output.weight"),
            "ffn_norm": w("ffn_norm.weight"),
            "gate": w("ffn_gate.weight"), "up": w("ffn_up.weight"), "down": w("ffn_down.weight"),
        }
        return fused_projections(self.backend, layer, i)

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be, hp = self.backend, self.hparams
        h = be.embedding(self.embed, token_ids)  # [n, d]
        for i, layer in enumerate(self.layers):
            h = be.add(h, self._attention(i, layer, be.rms_norm(h, layer["attn_norm"], hp.norm_eps),
                                          meta, kv))
            x = be.rms_norm(h, layer["ffn_norm"], hp.norm_eps)
            act = be.gated_act(*project(be, x, layer, ("gate", "up")), "silu")
            h = be.add(h, be.matmul(act, layer["down"]))
        h = be.rms_norm(be.take_rows(h, logit_rows), self.norm, hp.norm_eps)
        return be.matmul(h, self.head)  # [rows, vocab]

    def _attention(self, i: int, layer: dict, x: Tensor, meta: AttnMeta, kv) -> Tensor:
        be, hp = self.backend, self.hparams
        n, hd = meta.num_tokens, hp.head_dim
        q, k, v = project(be, x, layer, ("q", "k", "v"))
        q = be.reshape(q, (n, hp.num_heads, hd))
        k = be.reshape(k, (n, hp.num_kv_heads, hd))
        v = be.reshape(v, (n, hp.num_kv_heads, hd))
        if layer["q_norm"] is not None:
            q = be.rms_norm(q, layer["q_norm"], hp.norm_eps)
            k = be.rms_norm(k, layer["k_norm"], hp.norm_eps)
        q, k = be.rope(q, meta.positions, self.rope), be.rope(k, meta.positions, self.rope)
        be.kv_store(kv, i, k, v, meta.slot_mapping)
        window = hp.sliding_window if self._windowed(i) else None
        out = be.attention(q, kv, i, meta, self.scale, window=window)
        return be.matmul(be.reshape(out, (n, hp.num_heads * hd)), layer["o"])

    def _windowed(self, i: int) -> bool:
        hp = self.hparams
        if not hp.sliding_window:
            return False
        return hp.sliding_window_layers[i] if hp.sliding_window_layers else True
