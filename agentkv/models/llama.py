"""Llama-family decoder: Llama 2/3 (SmolLM2), Mistral (sliding window), Qwen2 (qkv bias),
Qwen3 (per-head q/k RMSNorm). One readable page; quantization never appears here."""
from __future__ import annotations

import math

import numpy as np

from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor
from agentkv.hal.blocks import AttentionSpec, BlockSpec, DenseFFNSpec
from agentkv.models.base import LoadOptions, Model, decoder_layer


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
        scale = 1.0 / math.sqrt(hp.head_dim)
        ffn = DenseFFNSpec("silu")
        self.blocks = [BlockSpec(AttentionSpec(hp.num_heads, hp.num_kv_heads, hp.head_dim, self.rope, scale,
                                               hp.sliding_window if self._windowed(i) else None, hp.norm_eps), ffn)
                       for i in range(hp.num_layers)]
        self.embed = self.weight("token_embd.weight")
        self.layers = [decoder_layer(self, i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    @staticmethod
    def _rope_scaling(source) -> dict | None:
        """Llama 3.x GGUFs carry their rope scaling as per-pair frequency divisors."""
        if source.has_tensor("rope_freqs.weight"):
            factors = source.dequantized("rope_freqs.weight").ravel()
            return {"type": "factors", "factors": tuple(float(f) for f in factors)}
        return source.hparams.rope_scaling

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be = self.backend
        h = be.embedding(self.embed, token_ids)  # [n, d]
        x = be.rms_norm(h, self.layers[0].attention.norm, self.hparams.norm_eps)
        for i, layer in enumerate(self.layers):
            # each block ends in the next norm: the next layer's attn_norm, then the final norm
            next_norm = self.layers[i + 1].attention.norm if i + 1 < len(self.layers) else self.norm
            h, x = be.decoder_block(h, x, layer, self.blocks[i], meta, kv, i, next_norm)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]

    def _windowed(self, i: int) -> bool:
        hp = self.hparams
        if not hp.sliding_window:
            return False
        return hp.sliding_window_layers[i] if hp.sliding_window_layers else True
