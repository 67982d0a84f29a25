"""DeepSeek-V2/V3 decoders (GGUF arch `deepseek2`; HF deepseek_v2, deepseek_v3; Kimi-K2 and
Moonlight load as V3): multi-head latent attention over a latent KV layout (`hal/mla.py`), then
leading dense FFNs (first_k_dense_replace) and mixture-of-experts FFNs with shared experts,
routed as the family says (V2: softmax, groups by their max; V3: sigmoid plus the correction
bias, groups by their best two). One readable page; quantization never appears here.

    x ─ attn_norm ─ latent attention (absorbed) ─(+x)─ h
    h ─ ffn_norm ─ dense FFN | router ─ top-k experts, weighted ─ + shared experts ─(+h)─ next layer
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.source import ModelSource
from agentkv.hal.base import AttnMeta, KVSpec, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.blocks import BlockSpec, DenseFFNSpec, MoEFFN, MoEFFNSpec
from agentkv.hal.mla import MLASpec, MLAWeights, kv_b_heads, mla_attention
from agentkv.hal.mla_sparse import IndexerSpec, IndexerWeights, sparse_mla_attention
from agentkv.models.base import LoadOptions, Model
from agentkv.models.config import SourceKeys
from agentkv.models.moe import MoEConfig, MoEModel

F32 = 0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's `0.1 * mscale * ln(factor) + 1` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True, slots=True)
class DeepseekConfig:
    """The family's knowledge on top of the MoE config: the latent attention's ranks and head
    dims, the rope layout, and the YaRN scaling with DeepSeek's mscale (folded into the rope
    tables' factor and the score scale)."""

    moe: MoEConfig
    q_rank: int | None  # q_lora_rank: None = a full-rank q projection (V2-Lite)
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    interleaved: bool
    rope_scaling: Any
    score_scale: float
    index: tuple[int, int, int] | None = None  # sparse attention's indexer: (heads, head dim, top-k)

    @classmethod
    def from_source(cls, source: ModelSource) -> DeepseekConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> DeepseekConfig:
        """From the file's keys; raises the reader's error naming a missing or bad key."""
        raw = keys.raw
        kv_rank = keys.get("attention.kv_lora_rank", "kv_lora_rank")
        rope_dim = keys.get("rope.dimension_count", "qk_rope_head_dim")
        if keys.gguf:
            key_len = keys.get("attention.key_length_mla", None) or keys.get("attention.key_length", None)
            v_dim = keys.get("attention.value_length_mla", None) or keys.get("attention.value_length", None)
            nope = None if key_len is None or rope_dim is None else int(key_len) - int(rope_dim)
        else:
            nope, v_dim = raw.get("qk_nope_head_dim"), raw.get("v_head_dim")
        for name, value in (("kv_lora_rank", kv_rank), ("qk_rope_head_dim", rope_dim), ("qk_nope_head_dim", nope)):
            if not isinstance(value, int) or value <= 0:
                raise keys.error(f"{name} is {value!r}; latent attention needs a positive int")
        if not isinstance(v_dim, int) or v_dim <= 0:
            raise keys.error(f"v_head_dim is {v_dim!r}; latent attention needs a positive int")
        q_rank = keys.get("attention.q_lora_rank", "q_lora_rank") or None
        interleaved = keys.gguf or raw.get("model_type") == "deepseek_v2" or bool(raw.get("rope_interleave", True))
        scaling, mscale = _yarn(keys, keys.hparams.rope_scaling)
        return cls(
            MoEConfig.from_keys(keys),
            q_rank=int(q_rank) if q_rank else None,
            kv_rank=int(kv_rank),
            nope_dim=int(nope),
            rope_dim=int(rope_dim),
            v_dim=int(v_dim),
            interleaved=interleaved,
            rope_scaling=scaling,
            score_scale=mscale * mscale / math.sqrt(nope + rope_dim),
            index=_indexer(keys),
        )

    @property
    def num_experts(self) -> int:
        return self.moe.num_experts

    @property
    def num_shared_experts(self) -> int:
        return self.moe.num_shared_experts

    @property
    def experts_per_token(self) -> int:
        return self.moe.experts_per_token

    def kv_bytes_per_token(self, element_bytes: int = 2) -> tuple[int, int]:
        """(the latent layout's, plain multi-head K/V's) bytes per token over every layer."""
        hp = self.moe.hparams
        latent = hp.num_layers * (self.kv_rank + self.rope_dim) * element_bytes
        per_head = hp.num_heads * (self.nope_dim + self.rope_dim + self.v_dim)
        return latent, hp.num_layers * per_head * element_bytes

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports, with the KV bytes per token
        (f16 elements) of the latent layout against the same model with multi-head K/V."""
        latent, mha = self.kv_bytes_per_token()
        return {
            **self.moe.summary(),
            "q_lora_rank": self.q_rank,
            "kv_lora_rank": self.kv_rank,
            "qk_nope_head_dim": self.nope_dim,
            "qk_rope_head_dim": self.rope_dim,
            "v_head_dim": self.v_dim,
            "kv_layout": "latent",
            "kv_bytes_per_token_f16": latent,
            "kv_bytes_per_token_f16_multi_head": mha,
        }


def _indexer(keys: SourceKeys) -> tuple[int, int, int] | None:
    """DeepSeek-V3.2's indexer (index_n_heads, index_head_dim, index_topk), None without one."""
    raw = keys.raw
    if raw.get("model_type") != "deepseek_v32":
        return None
    parts = tuple(raw.get(k) for k in ("index_n_heads", "index_head_dim", "index_topk"))
    if not all(isinstance(v, int) and v > 0 for v in parts):
        raise keys.error(f"index_n_heads / index_head_dim / index_topk are {parts!r}; expected positive ints")
    return parts


def _yarn(keys: SourceKeys, scaling: dict | None) -> tuple[dict | None, float]:
    """(the rope scaling with YaRN's table factor resolved, the score mscale). HF: tables times
    mscale(f, mscale) / mscale(f, mscale_all_dim), scores times mscale(f, mscale_all_dim)^2
    (transformers' yarn_apply_mscale). A GGUF states 0.1 * mscale_all_dim as
    yarn_log_multiplier (read into "mscale_all_dim" by formats/hparams.py) and llama.cpp keeps
    the tables unscaled."""
    if not scaling or scaling.get("type") != "yarn":
        return scaling, 1.0
    factor = float(scaling.get("factor") or 1.0)
    if keys.gguf:
        log_mul = float(scaling.get("mscale_all_dim") or 0.0)
        original = scaling.get("original_context_length", 4096)
        resolved = {**scaling, "attention_factor": 1.0, "original_max_position_embeddings": original}
        return resolved, 1.0 + log_mul * math.log(factor) if factor > 1 else 1.0
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    table = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all else None
    resolved = {**scaling, "attention_factor": table} if table else scaling
    return resolved, yarn_mscale(factor, mscale_all) if mscale_all else 1.0


class DeepseekModel(MoEModel):
    config_type = DeepseekConfig

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        Model.__init__(self, source, backend, options)
        hp, cfg = self.hparams, self.config
        self.rope = RopeSpec(
            cfg.rope_dim,
            hp.rope_theta,
            RopeStyle.INTERLEAVED if cfg.interleaved else RopeStyle.NEOX,
            cfg.rope_scaling,
        )
        self.mla = MLASpec(
            hp.num_heads, cfg.nope_dim, cfg.rope_dim, cfg.v_dim, cfg.kv_rank, self.rope, cfg.score_scale, hp.norm_eps
        )
        self.indexer = None
        if cfg.index is not None:
            heads, dim, top_k = cfg.index
            rope = RopeSpec(cfg.rope_dim, hp.rope_theta, RopeStyle.NEOX, cfg.rope_scaling)
            self.indexer = IndexerSpec(heads, dim, top_k, rope)
        moe = cfg.moe
        self.moe_spec = MoEFFNSpec(
            moe.num_experts, moe.experts_per_token, moe.norm_topk, weights_scale=moe.weights_scale, **dict(moe.routing)
        )
        self.expert_formats: dict[str, tuple[int, int]] = {}
        self.embed = self.weight("token_embd.weight")
        self.attn = [self._mla_weights(i) for i in range(hp.num_layers)]
        self.index_weights = [self._index_weights(i) for i in range(hp.num_layers)] if self.indexer else []
        self.ffns = [self._ffn(i) for i in range(hp.num_layers)]
        self.ffn_specs = [self.moe_spec if isinstance(f, MoEFFN) else DenseFFNSpec("silu") for f in self.ffns]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    def kv_spec(self, num_blocks: int, block_size: int) -> KVSpec:
        """One latent row per token and layer (`| latent | rope key | index key |`), no separate V."""
        hp, width = self.hparams, self.mla.latent_dim + (self.indexer.head_dim if self.indexer else 0)
        return KVSpec(hp.num_layers, num_blocks, block_size, 1, width, self.backend.kv_dtype, latent=True)

    def _index_weights(self, i: int) -> IndexerWeights:
        """Layer i's indexer (HF names: gguf-py maps none of them for deepseek2)."""
        w = lambda name: self.weight(f"model.layers.{i}.self_attn.indexer.{name}")  # noqa: E731
        return IndexerWeights(
            w("wq_b.weight"), w("wk.weight"), w("k_norm.weight"), w("k_norm.bias"), w("weights_proj.weight")
        )

    def _mla_weights(self, i: int) -> MLAWeights:
        """Layer i's latent attention; W_UK / W_UV per head from kv_b (f32: they are sliced
        and transposed once here) or from a GGUF's attn_k_b / attn_v_b."""
        w = lambda name, required=True: self.weight(f"blk.{i}.{name}", required)  # noqa: E731
        uk, uv = self._absorbed(i)
        low_rank = self.source.has_tensor(f"blk.{i}.attn_q_a.weight")
        return MLAWeights(
            norm=w("attn_norm.weight"),
            kv_a=w("attn_kv_a_mqa.weight"),
            kv_a_norm=w("attn_kv_a_norm.weight"),
            uk=uk,
            uv=uv,
            o=w("attn_output.weight"),
            q=None if low_rank else w("attn_q.weight"),
            q_a=w("attn_q_a.weight") if low_rank else None,
            q_a_norm=w("attn_q_a_norm.weight") if low_rank else None,
            q_b=w("attn_q_b.weight") if low_rank else None,
            kv_a_bias=w("attn_kv_a_mqa.bias", False),
        )

    def _absorbed(self, i: int) -> tuple[tuple[Weight, ...], tuple[Weight, ...]]:
        spec, be = self.mla, self.backend
        name = f"blk.{i}.attn_kv_b.weight"
        if self.source.has_tensor(name):
            kv_b = self.source.dequantized(name).reshape(spec.num_heads * (spec.nope_dim + spec.v_dim), spec.kv_rank)
            uk, uv = kv_b_heads(np.asarray(kv_b, np.float32), spec)
            self.weight_formats[name] = F32
        else:  # llama.cpp's split: attn_k_b [h, nope, kv_rank]... as the converter writes it
            uk, uv = self._split_kv_b(i)
            for part in ("k_b", "v_b"):
                self.weight_formats[f"blk.{i}.attn_{part}.weight"] = F32
        up = lambda tag, h, a: be.upload_weight(f"blk.{i}.{tag}[{h}]", a, F32, a.shape)  # noqa: E731
        return tuple(up("uk", h, a) for h, a in enumerate(uk)), tuple(up("uv", h, a) for h, a in enumerate(uv))

    def _split_kv_b(self, i: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """W_UK^T `[kv_rank, nope]` and W_UV `[v, kv_rank]` per head from a GGUF's attn_k_b
        `[h, kv_rank, nope]` (numpy order) and attn_v_b `[h, v, kv_rank]`."""
        spec = self.mla
        k_b = np.asarray(self.source.dequantized(f"blk.{i}.attn_k_b.weight"), np.float32)
        v_b = np.asarray(self.source.dequantized(f"blk.{i}.attn_v_b.weight"), np.float32)
        k_b = k_b.reshape(spec.num_heads, spec.kv_rank, spec.nope_dim)
        v_b = v_b.reshape(spec.num_heads, spec.v_dim, spec.kv_rank)
        return [np.ascontiguousarray(k) for k in k_b], [np.ascontiguousarray(v) for v in v_b]

    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray) -> Tensor:
        be, eps = self.backend, self.hparams.norm_eps
        h = be.embedding(self.embed, token_ids)  # [n, d]
        x = be.rms_norm(h, self.attn[0].norm, eps)
        for i, (attn, ffn) in enumerate(zip(self.attn, self.ffns)):
            if self.indexer is None:
                out = mla_attention(be, x, attn, self.mla, meta, kv, i)
            else:
                out = sparse_mla_attention(be, x, attn, self.mla, (self.index_weights[i], self.indexer), meta, kv, i)
            h, x = be.add_norm(h, out, ffn.norm, eps)
            next_norm = self.attn[i + 1].norm if i + 1 < len(self.attn) else self.norm
            h, x = be.add_norm(h, be.ffn(x, ffn, self.ffn_specs[i]), next_norm, eps)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]

    def _block_spec(self, i: int) -> BlockSpec:
        raise NotImplementedError("DeepseekModel runs its own blocks (hal/mla.py)")
