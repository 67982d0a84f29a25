"""Granite-4.0-H (`granitehybrid`, HF `granitemoehybrid`): Mamba-2 layers and a few attention
layers (no rope unless the config asks for it), each followed by an MoE with an always-on
shared expert (or the shared expert alone, a dense FFN). One page.

    h = embed * embedding_multiplier
    x ─ attn_norm ─┬ Mamba-2 layer: in_proj ─ conv + SSD recurrence (state slots) ─ gated norm ─ out_proj
                   └ attention layer: q, k, v ─ (rope) ─ attention (scale attention_multiplier) ─ o
    h += mixer * residual_multiplier
    h ─ ffn_norm ─ top-k experts (softmax over the chosen logits) + shared expert ─ h += · * residual_multiplier
    logits = head(norm(h)) / logits_scaling

The Mamba layers keep a conv state and an SSM state per sequence in `hal.recurrent.StateStore`,
one slot per KV block (the snapshot at the block's end); only the attention layers have paged KV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.blocks import (
    AttentionSpec,
    AttentionWeights,
    DenseFFN,
    DenseFFNSpec,
    MoEFFN,
    MoEFFNSpec,
    Projection,
    SharedExpert,
    project,
)
from agentkv.hal.mamba import Mamba2Spec, Mamba2Weights, mamba2
from agentkv.hal.state_store import StateStore
from agentkv.models.base import LoadOptions, Model, attention_weights
from agentkv.models.config import SourceKeys
from agentkv.models.hybrid_memory import HybridMemory, snapshot_summary
from agentkv.models.moe import MoEModel

MAMBA_TYPES = ("linear_attention", "mamba")  # HF layer_types / the older layers_block_type


@dataclass(frozen=True, slots=True)
class GraniteHybridConfig:
    """Which layers are Mamba-2, their shapes, the multipliers, rope and the experts."""

    hparams: HParams
    recurrent_layers: tuple[bool, ...]
    mamba: Mamba2Spec
    multipliers: tuple[float, float, float, float]  # embedding, attention, residual, logits divisor
    rope: bool
    num_experts: int = 0
    experts_per_token: int = 0

    @classmethod
    def from_source(cls, source: ModelSource) -> GraniteHybridConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> GraniteHybridConfig:
        """From config.json (HF) or `granitehybrid.*` (llama.cpp's converter: a layer with no
        K/V heads is a Mamba layer, and rope only where `rope.scaling.finetuned` says so)."""
        hp = keys.hparams
        layers, shapes, multipliers, rope = _gguf_keys(keys) if keys.gguf else _hf_keys(keys)
        if len(layers) != hp.num_layers:
            raise keys.error(f"the layer pattern has {len(layers)} entries, expected {hp.num_layers} layers")
        for name, value in shapes.items():
            if not isinstance(value, int) or value <= 0:
                raise keys.error(f"{name} is {value!r}; expected a positive integer")
        dt_min, dt_max = (0.0, math.inf) if keys.gguf else _time_step_limit(keys)
        num_experts = int(keys.get("expert_count", "num_local_experts", 0) or 0)
        return cls(
            hp,
            layers,
            Mamba2Spec(*shapes.values(), hp.norm_eps, dt_min, dt_max),
            multipliers=multipliers,
            rope=rope,
            num_experts=num_experts,
            experts_per_token=int(keys.get("expert_used_count", "num_experts_per_tok", 0) or 0) if num_experts else 0,
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports, with the two kinds of memory."""
        hp, m = self.hparams, self.mamba
        kv_token = 2 * self.recurrent_layers.count(False) * hp.num_kv_heads * hp.head_dim
        return {
            "layer_kinds": "".join("R" if r else "A" for r in self.recurrent_layers),
            "mamba_heads_x_dim": f"{m.num_heads}x{m.head_dim}",
            "mamba_groups_x_state": f"{m.num_groups}x{m.state_size}",
            **snapshot_summary(m.state_bytes * self.recurrent_layers.count(True)),
            "kv_bytes_per_token_f16": 2 * kv_token,
            "kv_bytes_per_token_f32": 4 * kv_token,
            "expert_count": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "rope": self.rope,
        }


def _hf_keys(keys: SourceKeys) -> tuple[tuple[bool, ...], dict[str, Any], tuple[float, ...], bool]:
    """(Mamba layers, Mamba-2 shapes by key, multipliers, rope) from config.json."""
    raw = keys.raw
    types = raw.get("layer_types") or raw.get("layers_block_type") or []
    heads = raw.get("mamba_n_heads")
    head_dim = raw.get("mamba_d_head", "auto")
    if head_dim == "auto" and isinstance(heads, int) and heads > 0:
        head_dim = int(raw.get("mamba_expand", 2)) * keys.hparams.hidden_size // heads
    shapes = {
        "mamba_n_heads": heads,
        "mamba_d_head": head_dim,
        "mamba_n_groups": raw.get("mamba_n_groups", 1),
        "mamba_d_state": raw.get("mamba_d_state"),
        "mamba_d_conv": raw.get("mamba_d_conv", 4),
    }
    names = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
    multipliers = tuple(float(raw[k]) if raw.get(k) is not None else 1.0 for k in names)
    return tuple(t in MAMBA_TYPES for t in types), shapes, multipliers, raw.get("position_embedding_type") == "rope"


def _gguf_keys(keys: SourceKeys) -> tuple[tuple[bool, ...], dict[str, Any], tuple[float, ...], bool]:
    """(Mamba layers, Mamba-2 shapes by key, multipliers, rope) from `granitehybrid.*`."""
    a = keys.arch
    kv_heads = keys.get("attention.head_count_kv", None)
    if not isinstance(kv_heads, list):
        raise keys.error(f"{a}.attention.head_count_kv is {kv_heads!r}; expected one entry per layer (0: Mamba)")
    heads, inner = keys.get("ssm.time_step_rank", None), keys.get("ssm.inner_size", None)
    shapes = {
        f"{a}.ssm.time_step_rank": heads,
        f"{a}.ssm.inner_size / time_step_rank": inner // heads if isinstance(inner, int) and heads else None,
        f"{a}.ssm.group_count": keys.get("ssm.group_count", None),
        f"{a}.ssm.state_size": keys.get("ssm.state_size", None),
        f"{a}.ssm.conv_kernel": keys.get("ssm.conv_kernel", None),
    }
    names = ("embedding_scale", "attention.scale", "residual_scale", "logit_scale")
    multipliers = tuple(float(keys.get(k, None, 1.0)) for k in names)
    return tuple(n == 0 for n in kv_heads), shapes, multipliers, bool(keys.get("rope.scaling.finetuned", None, False))


def _time_step_limit(keys: SourceKeys) -> tuple[float, float]:
    """HF `time_step_limit` (dt clamp); transformers writes infinity as {"__float__": "Infinity"}."""
    limit = keys.raw.get("time_step_limit") or (0.0, math.inf)
    try:
        low, high = (float(v["__float__"]) if isinstance(v, dict) else float(v) for v in limit)
    except (TypeError, ValueError, KeyError) as exc:
        raise keys.error(f"time_step_limit is {limit!r}; expected [min, max]") from exc
    return low, high


class Mixer(NamedTuple):
    """One layer's token mixer: Mamba-2 (`weights`, `slot_layer` its state layer) or attention
    (`attention`, `slot_layer` its KV layer). `norm` is the layer's input RMSNorm."""

    norm: Weight
    slot_layer: int
    in_proj: Projection | None = None
    out: Projection | None = None
    weights: Mamba2Weights | None = None
    attention: AttentionWeights | None = None


class GraniteHybridModel(HybridMemory, MoEModel):
    """Granite-4.0-H. Inherits only MoEModel's expert loading and its log line."""

    config_type = GraniteHybridConfig
    supports_lora = False  # no `layers` of DecoderLayers for runtime/adapters.py to attach to

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        Model.__init__(self, source, backend, options)
        hp, cfg = self.hparams, self.config
        gguf = source.kind == "gguf"  # llama.cpp's converter permutes q/k rows for interleaved rope
        style = RopeStyle.INTERLEAVED if gguf else RopeStyle.NEOX
        rope = RopeSpec(dim=hp.head_dim, theta=hp.rope_theta, style=style, scaling=hp.rope_scaling)
        self.attention_spec = AttentionSpec(
            hp.num_heads, hp.num_kv_heads, hp.head_dim, rope, cfg.multipliers[1], None, hp.norm_eps
        )
        self.moe_spec = (
            MoEFFNSpec(cfg.num_experts, cfg.experts_per_token, False, softmax_after_topk=True)
            if cfg.num_experts
            else None
        )
        self.expert_formats: dict[str, tuple[int, int]] = {}
        self.embed = self.weight("token_embd.weight")
        counters = {True: 0, False: 0}
        self.mixers = []
        for i, recurrent in enumerate(cfg.recurrent_layers):
            self.mixers.append(self._mixer(i, recurrent, counters[recurrent]))
            counters[recurrent] += 1
        self.ffns = [self._ffn(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    # -- loading ------------------------------------------------------------------------------
    def _mixer(self, i: int, recurrent: bool, slot_layer: int) -> Mixer:
        w = lambda name, required=True: self.weight(f"blk.{i}.{name}", required)  # noqa: E731
        if not recurrent:
            attention = attention_weights(self, i, qk_norms=False)
            return Mixer(attention.norm, slot_layer, attention=attention)
        in_proj = Projection((w("ssm_in.weight"),), (w("ssm_in.bias", False),))  # biases: mamba_proj_bias
        out = Projection((w("ssm_out.weight"),), (w("ssm_out.bias", False),))
        return Mixer(w("attn_norm.weight"), slot_layer, in_proj, out, self._mamba_weights(i))

    def _mamba_weights(self, i: int) -> Mamba2Weights:
        """The conv, its bias, decay, dt bias, skip and gated-norm gain of layer i (host f32)."""
        src, spec, gguf = self.source, self.config.mamba, self.source.kind == "gguf"
        host = lambda name: src.dequantized(name).astype(np.float32).reshape(-1)  # noqa: E731
        bias, a = f"blk.{i}.ssm_conv1d.bias", host(f"blk.{i}.ssm_a")
        return Mamba2Weights(
            conv=np.ascontiguousarray(host(f"blk.{i}.ssm_conv1d.weight").reshape(spec.conv_dim, spec.conv_kernel)),
            conv_bias=host(bias) if src.has_tensor(bias) else None,
            a_neg=a if gguf else (-np.exp(a)).astype(np.float32),  # llama.cpp stores -exp(A_log)
            dt_bias=host(f"blk.{i}.ssm_dt.bias" if gguf else f"model.layers.{i}.mamba.dt_bias"),
            d=host(f"blk.{i}.ssm_d"),
            norm=host(f"blk.{i}.ssm_norm.weight"),
        )

    def _ffn(self, i: int) -> DenseFFN | MoEFFN:
        """The shared expert, alone (a dense FFN) or beside the experts. HF keeps its gate|up as
        one `input_linear`; llama.cpp's converter splits it (`ffn_{gate,up}` when dense)."""
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        dense, fused = not self.config.num_experts, f"model.layers.{i}.shared_mlp.input_linear.weight"
        if self.source.has_tensor(fused):
            gate_up, down = Projection(self._halves(fused)), w("ffn_down_shexp.weight")
        else:
            tail = "" if dense else "_shexp"
            gate_up = Projection((w(f"ffn_gate{tail}.weight"), w(f"ffn_up{tail}.weight")))
            down = w(f"ffn_down{tail}.weight")
        if dense:
            return DenseFFN(w("ffn_norm.weight"), gate_up.fused(self.backend, f"blk.{i}.gate+up"), down)
        experts = self._experts(i)
        return MoEFFN(w("ffn_norm.weight"), w("ffn_gate_inp.weight"), experts, SharedExpert(gate_up, down))

    def _halves(self, name: str) -> tuple[Weight, Weight]:
        """A `[2 f, d]` tensor as two `[f, d]` weights (first rows, last rows)."""
        info = self.source.tensor(name)
        f = info.shape[0] // 2
        resident = self.options.weights == "resident"
        parts = []
        for tag, rows in (("gate", slice(0, f)), ("up", slice(f, 2 * f))):
            part = self.backend.upload_weight(
                f"{name}[{tag}]", info.data[rows], info.qtype, (f, *info.shape[1:]), resident=resident
            )
            self.weight_formats[name] = part.qtype  # keyed by the file tensor both halves view
            parts.append(part)
        return parts[0], parts[1]

    # -- memory ---------------------------------------------------------------------------------
    @property
    def recurrent_spec(self):
        return self.config.mamba

    # -- the step ---------------------------------------------------------------------------------
    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray, states=None) -> Tensor:
        """`states`: the runner's StateStore (the Mamba layers read and write its slots)."""
        if states is None:
            raise ValueError(f"{self.hparams.arch}: a hybrid model's forward needs its StateStore (states=)")
        be, eps = self.backend, self.hparams.norm_eps
        embedding, _, residual, logits_div = self.config.multipliers
        h = be.scale(be.embedding(self.embed, token_ids), embedding)  # [n, d]
        x = be.rms_norm(h, self.mixers[0].norm, eps)
        for i, mixer in enumerate(self.mixers):
            mixed = self._mix(mixer, x, meta, kv, states)
            h, x = be.add_norm(h, be.scale(mixed, residual), self.ffns[i].norm, eps)
            next_norm = self.mixers[i + 1].norm if i + 1 < len(self.mixers) else self.norm
            spec = self.moe_spec if isinstance(self.ffns[i], MoEFFN) else DenseFFNSpec("silu")
            h, x = be.add_norm(h, be.scale(be.ffn(x, self.ffns[i], spec), residual), next_norm, eps)
        return be.scale(be.matmul(be.take_rows(x, logit_rows), self.head), 1.0 / logits_div)  # [rows, vocab]

    def _mix(self, mixer: Mixer, x: Tensor, meta: AttnMeta, kv, states: StateStore) -> Tensor:
        be, a = self.backend, self.attention_spec
        if mixer.attention is None:
            projected = project(be, x, mixer.in_proj)
            core = mamba2(be, projected, mixer.weights, self.config.mamba, states, mixer.slot_layer, meta)
            return project(be, core, mixer.out)
        qkv = project(be, x, mixer.attention.qkv)
        if self.config.rope:
            q = be.attention_inputs(qkv, meta, kv, mixer.slot_layer, a)
        else:  # NoPE: what attention_inputs does, less the rotation
            q, k, v = qkv if isinstance(qkv, list) else be.split(qkv, a.qkv_sizes)
            n, hd = q.shape[0], a.head_dim
            q = be.reshape(q, (n, a.num_heads, hd))
            k, v = be.reshape(k, (n, a.num_kv_heads, hd)), be.reshape(v, (n, a.num_kv_heads, hd))
            be.kv_store(kv, mixer.slot_layer, k, v, meta.slot_mapping)
        out = be.attention(q, kv, mixer.slot_layer, meta, a.scale)
        return be.matmul(be.reshape(out, (q.shape[0], a.num_heads * a.head_dim)), mixer.attention.o)
