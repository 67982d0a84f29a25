"""Mixture-of-experts decoders: Qwen2-MoE (routed experts plus a sigmoid-gated shared expert),
Qwen3-MoE (per-head q/k norm), Mixtral (GGUF arch `llama` with experts) and OLMoE (q/k RMSNorm
over the whole projection). Attention is the llama family's; the FFN is a `MoEFFN`, whose
experts stay in the file's format. One readable page; quantization never appears here.

    x ─ attn_norm ─ attention ─(+x)─ h
    h ─ ffn_norm ─ router ─ top-k experts, weighted ─(+ shared expert)─(+h)─ next layer
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.experts import EXPERT_PROJECTIONS, expert_tensors
from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.blocks import (
    AttentionSpec,
    BlockSpec,
    DecoderLayer,
    DenseFFN,
    DenseFFNSpec,
    Experts,
    MoEFFN,
    MoEFFNSpec,
    Projection,
    SharedExpert,
    project,
    tiled_gate,
)
from agentkv.hal.lora import LoraView
from agentkv.models.base import LoadOptions, Model, attention_weights, dense_ffn
from agentkv.models.config import SourceKeys
from agentkv.models.llama import LlamaConfig

log = logging.getLogger(__name__)

# llama.cpp hard-codes whether the chosen experts' weights are renormalised, per architecture
# (build_moe_ffn's norm_w in src/models/*.cpp); a GGUF's `<arch>.expert_weights_norm`, where
# present, says it for the file. The HF configs say it with norm_topk_prob (Mixtral: always).
GGUF_NORM_TOPK = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False, "glm4moe": True}
SHARED_EXPERTS = {"qwen2moe": 1}  # routed-plus-shared families: experts every token runs
WHOLE_QK_NORM = ("olmoe",)  # q/k RMSNorm over the whole projection, not per head
# Sigmoid-scored routers (HF model_type; a GGUF says it with expert_gating_func 2); their
# e_score_correction_bias (GGUF `exp_probs_b.bias`) moves the choice, never the weights.
SIGMOID_ROUTERS = ("glm4_moe", "deepseek_v3", "deepseek_v32")
GGUF_GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE
FFN_NORM = {"glm4moe": "post_attention_norm"}  # the FFN's input norm where it is not ffn_norm


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """An MoE family's knowledge on top of the shared hparams: the llama-style attention
    config, expert count, experts per token, renormalisation, expert FFN widths, shared experts."""

    hparams: HParams
    attention: LlamaConfig
    num_experts: int
    experts_per_token: int
    norm_topk: bool
    expert_ffn_len: int
    num_shared_experts: int = 0
    shared_ffn_len: int | None = None
    weights_scale: float = 1.0
    whole_qk_norm: bool = False
    routing: tuple[tuple[str, Any], ...] = ()  # MoEFFNSpec's scoring/group fields (hal/routing.py)

    @classmethod
    def from_source(cls, source: ModelSource) -> MoEConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> MoEConfig:
        """From the file's shared hparams and raw keys; raises the reader's error naming the
        key when the expert count or experts per token is missing or out of range."""
        hp, raw = keys.hparams, keys.raw
        num = keys.get("expert_count", "num_experts") or raw.get("num_local_experts") or raw.get("n_routed_experts")
        used = keys.get("expert_used_count", "num_experts_per_tok")
        if not isinstance(num, int) or num <= 0:
            raise keys.error(f"expert count is {num!r}; a mixture-of-experts model needs > 0")
        if not isinstance(used, int) or not 0 < used <= num:
            raise keys.error(f"experts per token is {used!r}; expected 1..{num}")
        if keys.gguf:
            norm = bool(keys.get("expert_weights_norm", None, GGUF_NORM_TOPK.get(hp.arch, False)))
        else:
            norm = raw.get("model_type") == "mixtral" or bool(raw.get("norm_topk_prob", False))
        if raw.get("clip_qkv") is not None:
            raise keys.error(f"clip_qkv={raw['clip_qkv']!r} is not supported")
        shared = int(keys.get("expert_shared_count", "n_shared_experts", SHARED_EXPERTS.get(hp.arch, 0)))
        return cls(
            hp,
            _partial_rotary(keys, LlamaConfig.from_keys(keys)),
            num,
            used,
            norm,
            expert_ffn_len=int(keys.get("expert_feed_forward_length", "moe_intermediate_size", hp.intermediate_size)),
            num_shared_experts=shared,
            shared_ffn_len=int(
                keys.get("expert_shared_feed_forward_length", "shared_expert_intermediate_size", hp.intermediate_size)
            )
            if shared
            else None,
            weights_scale=float(keys.get("expert_weights_scale", "routed_scaling_factor", 0.0)) or 1.0,
            whole_qk_norm=hp.arch in WHOLE_QK_NORM,
            routing=_routing(keys, num),
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports."""
        return {
            **self.attention.summary(),
            "expert_count": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "shared_experts": self.num_shared_experts,
            "expert_ffn_length": self.expert_ffn_len,
            "shared_expert_ffn_length": self.shared_ffn_len,
            "expert_weights_norm": self.norm_topk,
            **dict(self.routing),
        }


def _routing(keys: SourceKeys, num_experts: int) -> tuple[tuple[str, Any], ...]:
    """The router's scoring and group-limited choice, as MoEFFNSpec fields: GGUF
    `expert_gating_func`, `expert_group_count`, `expert_group_used_count`; HF model_type,
    `n_group`, `topk_group`, `topk_method` (DeepSeek-V2's groups score by their max)."""
    if keys.gguf:
        gating = keys.get("expert_gating_func", None, 1)
        if gating not in GGUF_GATING:
            raise keys.error(f"{keys.arch}.expert_gating_func = {gating!r}; supported: {sorted(GGUF_GATING)}")
        scoring = GGUF_GATING[gating]
    else:
        scoring = "sigmoid" if keys.raw.get("model_type") in SIGMOID_ROUTERS else "softmax"
    groups = int(keys.get("expert_group_count", "n_group", 1) or 1)
    used = int(keys.get("expert_group_used_count", "topk_group", groups) or groups)
    if keys.raw.get("topk_method") == "greedy":
        groups = used = 1  # DeepSeek-V2(-Lite): the config's groups are unused
    if num_experts % groups or not 0 < used <= groups:
        raise keys.error(f"expert groups {groups} (using {used}) do not divide {num_experts} experts")
    group_score = "max" if scoring == "softmax" else "top2"  # DeepSeek-V2 | V3 and GLM-4.5
    if (scoring, groups) == ("softmax", 1):
        return ()
    return (("scoring", scoring), ("num_groups", groups), ("top_groups", used), ("group_score", group_score))


def _partial_rotary(keys: SourceKeys, attention: LlamaConfig) -> LlamaConfig:
    """GLM-4.5 rotates the first head_dim * partial_rotary_factor dims of each head (a GGUF
    states the count as rope.dimension_count, which LlamaConfig reads)."""
    rope = keys.raw.get("rope_parameters") or {}
    factor = keys.raw.get(
        "partial_rotary_factor", rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    )
    if keys.gguf or not factor:
        return attention
    return dataclasses.replace(attention, rope_dim=int(keys.hparams.head_dim * float(factor)))


class MoEModel(Model):
    config_type = MoEConfig
    supports_lora = True  # runtime/adapters.py: attention projections and routed experts

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp, cfg = self.hparams, self.config
        att = cfg.attention
        self.rope = RopeSpec(
            dim=att.rope_dim,
            theta=hp.rope_theta,
            style=RopeStyle.INTERLEAVED if att.interleaved else RopeStyle.NEOX,
            scaling=hp.rope_scaling,
        )
        self.moe_spec = MoEFFNSpec(
            cfg.num_experts, cfg.experts_per_token, cfg.norm_topk, weights_scale=cfg.weights_scale, **dict(cfg.routing)
        )
        self.expert_formats: dict[str, tuple[int, int]] = {}  # file tensor -> (file qtype, resident qtype)
        self.embed = self.weight("token_embd.weight")
        self.layers = [self._layer(i) for i in range(hp.num_layers)]
        # OLMoE's q/k norms `[h * hd]`, `[kvh * hd]` per layer (applied in `OlmoeBlock`)
        self.proj_norms = (
            [
                (self.weight(f"blk.{i}.attn_q_norm.weight"), self.weight(f"blk.{i}.attn_k_norm.weight"))
                for i in range(hp.num_layers)
            ]
            if cfg.whole_qk_norm
            else []
        )
        self.blocks = [self._block_spec(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")
        log.info(
            "%s: %d experts, %d per token, %d shared; %s",
            hp.arch,
            cfg.num_experts,
            cfg.experts_per_token,
            cfg.num_shared_experts,
            self.experts_summary(),
        )

    def _block_spec(self, i: int) -> BlockSpec:
        hp, att = self.hparams, self.config.attention
        window = att.sliding_window if att.sliding_window and att.sliding_window_layers[i] else None
        ffn = self.moe_spec if isinstance(self.layers[i].ffn, MoEFFN) else DenseFFNSpec("silu")
        return BlockSpec(
            AttentionSpec(
                hp.num_heads, hp.num_kv_heads, hp.head_dim, self.rope, 1.0 / math.sqrt(hp.head_dim), window, hp.norm_eps
            ),
            ffn,
        )

    def _layer(self, i: int) -> DecoderLayer:
        """Layer i: llama attention (per-head q/k norms where the file has them, except OLMoE's
        whole-projection norms, applied in `OlmoeBlock`), and an MoE FFN where the layer has
        a router, else a dense one (Qwen2-MoE's mlp_only_layers)."""
        attention = attention_weights(self, i, qk_norms=False if self.config.whole_qk_norm else None)
        return DecoderLayer(attention, self._ffn(i))

    def _ffn(self, i: int) -> DenseFFN | MoEFFN:
        """Layer i's FFN: an MoE one where the layer has a router, else a dense one (Qwen2-MoE's
        mlp_only_layers, the leading dense layers of GLM-4.5 and DeepSeek: first_k_dense_replace)."""
        norm = FFN_NORM.get(self.hparams.arch, "ffn_norm")
        if not self.source.has_tensor(f"blk.{i}.ffn_gate_inp.weight"):
            return dense_ffn(self, i, norm_name=norm)
        w = lambda name, required=True: self.weight(f"blk.{i}.{name}", required)  # noqa: E731
        shared = None
        if self.config.num_shared_experts:
            shared = SharedExpert(
                Projection((w("ffn_gate_shexp.weight"), w("ffn_up_shexp.weight"))),
                w("ffn_down_shexp.weight"),
                self._row_weight(f"blk.{i}.ffn_gate_inp_shexp.weight"),
            )
        router = w("ffn_gate_inp.weight")
        return MoEFFN(w(f"{norm}.weight"), router, self._experts(i), shared, score_bias=self._score_bias(i))

    def _score_bias(self, i: int) -> Weight | None:
        """Layer i's e_score_correction_bias `[num_experts]` (GGUF or HF name), or None."""
        for name in (f"blk.{i}.exp_probs_b.bias", f"model.layers.{i}.mlp.gate.e_score_correction_bias"):
            if self.source.has_tensor(name):
                return self.weight(name)
        return None

    def _row_weight(self, name: str) -> Weight | None:
        """A `[d]` (GGUF) or `[1, d]` (HF) gate vector as a one-row linear weight `[1, d]`."""
        if not self.source.has_tensor(name):
            return None
        info = self.source.tensor(name)
        w = self.backend.upload_weight(
            name,
            np.asarray(info.data).reshape(1, -1),
            info.qtype,
            (1, info.shape[-1]),
            resident=self.options.weights == "resident",
        )
        self.weight_formats[name] = w.qtype
        return tiled_gate(self.backend, w)

    def _experts(self, i: int) -> Experts:
        """Layer i's experts, one resident Weight per expert viewing the file's tensors."""
        parts = {}
        for projection in EXPERT_PROJECTIONS:
            tensors = expert_tensors(self.source, i, projection, self.config.num_experts)
            parts[projection] = tuple(
                self.backend.upload_weight(
                    v.name, v.data, v.qtype, v.shape, resident=self.options.weights == "resident"
                )
                for v in tensors.views
            )
            for name in tensors.sources:
                self.weight_formats[name] = parts[projection][0].qtype
                self.expert_formats[name] = (tensors.views[0].qtype, parts[projection][0].qtype)
        return Experts(**parts)

    def experts_summary(self) -> str:
        """Which expert tensors stayed in their quant type and which became f32 (the load log)."""
        from agentkv.formats.quants import QUANT_NAMES

        name = lambda q: QUANT_NAMES.get(q, str(q))  # noqa: E731
        kept = Counter(name(f) for f, r in self.expert_formats.values() if f == r and f not in (0, 1))
        plain = Counter(name(f) for f, r in self.expert_formats.values() if f == r and f in (0, 1))
        fell = Counter(name(f) for f, r in self.expert_formats.values() if f != r)
        parts = [f"{n} {q}" for q, n in sorted(kept.items())] + [f"{n} {q} as stored" for q, n in sorted(plain.items())]
        text = f"{len(self.expert_formats)} expert tensors resident: " + (", ".join(parts) or "none")
        return text + (
            f"; dequantized to f32: {', '.join(f'{n} {q}' for q, n in sorted(fell.items()))}" if fell else ""
        )

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray, lora=None) -> Tensor:
        """`lora` (a hal.lora.LoraStep): the step's per-row adapters, added to the projections
        and the routed experts (the blocks run on a `LoraView` of the backend)."""
        be = self.backend
        h = be.embedding(self.embed, token_ids)  # [n, d]
        x = be.rms_norm(h, self.layers[0].attention.norm, self.hparams.norm_eps)
        blocks = be if lora is None else LoraView(be, lora)
        block = OlmoeBlock(blocks, self.proj_norms) if self.config.whole_qk_norm else blocks.decoder_block
        for i, layer in enumerate(self.layers):
            next_norm = self.layers[i + 1].attention.norm if i + 1 < len(self.layers) else self.norm
            h, x = block(h, x, layer, self.blocks[i], meta, kv, i, next_norm)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]


class OlmoeBlock:
    """`Backend.decoder_block` with OLMoE's q/k RMSNorm over the whole projection (`[h * hd]`,
    `[kvh * hd]`) before the heads are split and rotated, on `be` (the backend or a LoraView)."""

    def __init__(self, be, proj_norms: list[tuple[Weight, Weight]]):
        self.be, self.proj_norms = be, proj_norms

    def __call__(
        self,
        h: Tensor,
        x: Tensor,
        layer: DecoderLayer,
        spec: BlockSpec,
        meta: AttnMeta,
        kv,
        index: int,
        next_norm: Weight,
    ) -> tuple[Tensor, Tensor]:
        be, a = self.be, spec.attention
        qkv = project(be, x, layer.attention.qkv)
        q, k, v = qkv if isinstance(qkv, list) else be.split(qkv, a.qkv_sizes)
        q_norm, k_norm = self.proj_norms[index]
        q, k = be.rms_norm(q, q_norm, a.eps), be.rms_norm(k, k_norm, a.eps)
        q = be.attention_inputs([q, k, v], meta, kv, index, a)
        out = be.attention(q, kv, index, meta, a.scale, window=a.window)
        o = be.matmul(be.reshape(out, (q.shape[0], a.num_heads * a.head_dim)), layer.attention.o)
        h, x = be.add_norm(h, o, layer.ffn.norm, a.eps)
        return be.add_norm(h, be.ffn(x, layer.ffn, spec.ffn), next_norm, a.eps)
