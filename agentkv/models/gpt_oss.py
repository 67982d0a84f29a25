"""gpt-oss (GGUF arch `gpt-oss`, HF `gpt_oss`): biased q/k/v/o, attention sinks (a learned
logit per head in each row's softmax denominator), layers alternating between a sliding
window and full attention, YaRN rope, and routed experts with biases and the clamped SwiGLU
(`hal/biased_moe.py`). One readable page; quantization never appears here.

    x ─ attn_norm ─ q/k/v (+bias) ─ rope ─ attention with sinks ─ o (+bias) ─(+x)─ h
    h ─ post_attention_norm ─ router (+bias): top-k, softmax ─ experts (+bias) ─(+h)─ next layer
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.experts import EXPERT_PROJECTIONS, expert_tensors
from agentkv.formats.source import HParams, ModelSource, TensorInfo
from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.biased_moe import BiasedMoEFFN, BiasedMoEFFNSpec
from agentkv.hal.blocks import AttentionSpec, BlockSpec, DecoderLayer, Experts, project
from agentkv.models.base import LoadOptions, Model, attention_weights
from agentkv.models.config import SourceKeys, layer_letters, sliding_layers

log = logging.getLogger(__name__)

# A HF folder keeps each layer's experts as 3-D tensors: gate and up interleaved by column
# (gate = even, up = odd) in `[E, d, 2f]`, down `[E, f, d]`, each `x @ W` (not `W @ x`).
HF_EXPERTS = "model.layers.{i}.mlp.experts."


@dataclass(frozen=True, slots=True)
class GptOssConfig:
    """gpt-oss's own knowledge on top of the shared hparams: experts, the window and which
    layers slide (every other one, the first sliding), and the clamped SwiGLU's constants."""

    hparams: HParams
    num_experts: int
    experts_per_token: int
    expert_ffn_len: int
    sliding_window: int | None
    sliding_window_layers: tuple[bool, ...] | None
    swiglu_alpha: float = 1.702  # llama.cpp hard-codes both for gpt-oss
    swiglu_limit: float = 7.0

    @classmethod
    def from_source(cls, source: ModelSource) -> GptOssConfig:
        keys = SourceKeys.of(source)
        hp, raw = keys.hparams, keys.raw
        num = keys.get("expert_count", "num_local_experts")
        used = keys.get("expert_used_count", "num_experts_per_tok")
        if not isinstance(num, int) or num <= 0:
            raise keys.error(f"expert count is {num!r}; gpt-oss needs > 0")
        if not isinstance(used, int) or not 0 < used <= num:
            raise keys.error(f"experts per token is {used!r}; expected 1..{num}")
        window, layers = sliding_layers(keys, keys.get("attention.sliding_window", "sliding_window"), period=2)
        return cls(
            hp,
            num,
            used,
            int(keys.get("expert_feed_forward_length", "intermediate_size", hp.intermediate_size)),
            window,
            layers,
            swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports."""
        return {
            "sliding_window": self.sliding_window,
            "sliding_window_layers": layer_letters(self.sliding_window_layers),
            "expert_count": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "expert_ffn_length": self.expert_ffn_len,
            "attention_sinks": True,
        }


class GptOssModel(Model):
    config_type = GptOssConfig

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp, cfg = self.hparams, self.config
        self.rope = RopeSpec(dim=hp.head_dim, theta=hp.rope_theta, style=RopeStyle.NEOX, scaling=hp.rope_scaling)
        ffn = BiasedMoEFFNSpec(cfg.num_experts, cfg.experts_per_token, cfg.swiglu_alpha, cfg.swiglu_limit)
        self.blocks = [
            BlockSpec(
                AttentionSpec(
                    hp.num_heads,
                    hp.num_kv_heads,
                    hp.head_dim,
                    self.rope,
                    1.0 / math.sqrt(hp.head_dim),
                    cfg.sliding_window if cfg.sliding_window and cfg.sliding_window_layers[i] else None,
                    hp.norm_eps,
                ),
                ffn,
            )
            for i in range(hp.num_layers)
        ]
        self.embed = self.weight("token_embd.weight")
        self.expert_formats: dict[str, int] = {}  # expert tensor -> resident qtype (inspect, the load log)
        self.layers = [DecoderLayer(attention_weights(self, i), self._ffn(i)) for i in range(hp.num_layers)]
        self.o_bias = [self.weight(f"blk.{i}.attn_output.bias", False) for i in range(hp.num_layers)]
        self.sinks = [self._sinks(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")
        log.info(
            "gpt-oss: %d experts, %d per token; %s", cfg.num_experts, cfg.experts_per_token, self.experts_summary()
        )

    def _sinks(self, i: int) -> Weight:
        """Layer i's sinks `[num_heads]` (`blk.{i}.attn_sinks.weight` in a GGUF, `.attn_sinks` mapped from HF)."""
        name = f"blk.{i}.attn_sinks.weight"
        return self.weight(name if self.source.has_tensor(name) else f"blk.{i}.attn_sinks")

    def _ffn(self, i: int) -> BiasedMoEFFN:
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        views = self._expert_views(i)
        upload = lambda v: self.backend.upload_weight(  # noqa: E731
            v.name, v.data, v.qtype, v.shape, resident=self.options.weights == "resident"
        )
        banks = {p: tuple(upload(v) for v in views[p]) for p in EXPERT_PROJECTIONS}
        biases = {p: tuple(upload(v) for v in views[p + "_bias"]) for p in EXPERT_PROJECTIONS}
        for p in EXPERT_PROJECTIONS:
            self.expert_formats[f"blk.{i}.ffn_{p}_exps"] = banks[p][0].qtype
        return BiasedMoEFFN(
            w("post_attention_norm.weight"),
            w("ffn_gate_inp.weight"),
            w("ffn_gate_inp.bias"),
            Experts(**banks),
            biases["gate"],
            biases["up"],
            biases["down"],
        )

    def _expert_views(self, i: int) -> dict[str, tuple[TensorInfo, ...]]:
        """Per-expert `[out, in]` weights and their biases. The weights: views of the 3-D
        `ffn_*_exps` tensors (a GGUF's, or a HF MXFP4 folder's as the reader presents them),
        or a plain HF folder's interleaved gate|up split and transposed (a copy in the file's
        dtype). The biases: a GGUF's `ffn_*_exps.bias`, or HF's `gate_up_proj_bias` split."""
        E, src = self.config.num_experts, self.source
        if src.has_tensor(f"blk.{i}.ffn_gate_exps.weight"):
            out = {p: expert_tensors(src, i, p, E).views for p in EXPERT_PROJECTIONS}
        else:
            out = self._hf_experts(i)
        if src.has_tensor(f"blk.{i}.ffn_gate_exps.bias"):
            for p in EXPERT_PROJECTIONS:
                bias = src.tensor(f"blk.{i}.ffn_{p}_exps.bias")
                out[p + "_bias"] = tuple(_row(bias, e, bias.data[e]) for e in range(E))
            return out
        base = HF_EXPERTS.format(i=i)
        gu_bias, d_bias = src.tensor(base + "gate_up_proj_bias"), src.tensor(base + "down_proj_bias")
        out["gate_bias"] = tuple(_row(gu_bias, e, gu_bias.data[e, 0::2]) for e in range(E))
        out["up_bias"] = tuple(_row(gu_bias, e, gu_bias.data[e, 1::2]) for e in range(E))
        out["down_bias"] = tuple(_row(d_bias, e, d_bias.data[e]) for e in range(E))
        return out

    def _hf_experts(self, i: int) -> dict[str, tuple[TensorInfo, ...]]:
        """A plain HF folder's experts (`x @ W` layout, gate|up interleaved by column) as `[out, in]`."""
        E, src, base = self.config.num_experts, self.source, HF_EXPERTS.format(i=i)
        down_name = f"blk.{i}.ffn_down_exps"  # gguf-py's map names HF's down_proj so, without `.weight`
        gate_up = src.tensor(base + "gate_up_proj")
        down = src.tensor(down_name if src.has_tensor(down_name) else base + "down_proj")
        t = lambda info, e, cols: _row(info, e, np.ascontiguousarray(info.data[e][:, cols].T))  # noqa: E731
        return {
            "gate": tuple(t(gate_up, e, slice(0, None, 2)) for e in range(E)),
            "up": tuple(t(gate_up, e, slice(1, None, 2)) for e in range(E)),
            "down": tuple(t(down, e, slice(None)) for e in range(E)),
        }

    def experts_summary(self) -> str:
        """What the expert tensors are resident as (the load log and inspect)."""
        from collections import Counter

        from agentkv.formats.quants import QUANT_NAMES

        kinds = Counter(QUANT_NAMES.get(q, str(q)) for q in self.expert_formats.values())
        return f"{len(self.expert_formats)} expert tensors resident: " + ", ".join(
            f"{n} {q}" for q, n in sorted(kinds.items())
        )

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be = self.backend
        h = be.embedding(self.embed, token_ids)  # [n, d]
        x = be.rms_norm(h, self.layers[0].attention.norm, self.hparams.norm_eps)
        for i in range(len(self.layers)):
            next_norm = self.layers[i + 1].attention.norm if i + 1 < len(self.layers) else self.norm
            h, x = self._block(h, x, i, meta, kv, next_norm)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]

    def _block(self, h: Tensor, x: Tensor, i: int, meta: AttnMeta, kv, next_norm: Weight) -> tuple[Tensor, Tensor]:
        """`Backend.decoder_block` with the sinks inside attention and o's bias."""
        be, layer, a = self.backend, self.layers[i], self.blocks[i].attention
        q = be.attention_inputs(project(be, x, layer.attention.qkv), meta, kv, i, a)
        out = be.attention_sinks(q, kv, i, meta, a.scale, a.window, self.sinks[i])
        o = be.matmul(be.reshape(out, (q.shape[0], a.num_heads * a.head_dim)), layer.attention.o, self.o_bias[i])
        h, x = be.add_norm(h, o, layer.ffn.norm, a.eps)
        return be.add_norm(h, be.ffn(x, layer.ffn, self.blocks[i].ffn), next_norm, a.eps)


def _row(info: TensorInfo, e: int, data: np.ndarray) -> TensorInfo:
    """Expert e's slice of `info` as its own tensor (shape from the data, the file's qtype)."""
    return TensorInfo(f"{info.name}[{e}]", tuple(data.shape), info.qtype, data)
