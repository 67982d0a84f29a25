"""Hybrid decoders of gated DeltaNet and gated full attention: Qwen3-Next (`qwen3next`, MoE
with a gated shared expert) and the Qwen3.5 text models (`qwen35`, dense FFN; `qwen35moe`,
Qwen3-Next's MoE). One page.

    x ─ attn_norm ─┬ recurrent layer: qkv|z|b|a ─ conv + gated delta rule (state slots) ─ out
                   └ every n-th layer: q|gate, k, v ─ q/k norm, partial rope ─ attention ─ ·σ(gate) ─ o
    h ─ post_attention_norm ─ FFN (MoE + shared expert, or dense) ─(+h)─ next layer

The recurrent layers keep a fixed-size state per sequence in `hal.recurrent.StateStore`, one
slot per KV block (the snapshot at the block's end); only the attention layers have paged KV.
RMSNorm gains are zero-centred (1 + w) in HF folders; llama.cpp's converter adds the 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import AttnMeta, RopeSpec, RopeStyle, Tensor, Weight
from agentkv.hal.blocks import AttentionSpec, DenseFFN, DenseFFNSpec, MoEFFN, MoEFFNSpec, Projection, SharedExpert
from agentkv.hal.recurrent import DeltaNetSpec, DeltaNetWeights, delta_net, gate_heads, sigmoid_gate
from agentkv.hal.state_store import StateStore
from agentkv.models.base import LoadOptions, Model
from agentkv.models.config import SourceKeys
from agentkv.models.hybrid_memory import HybridMemory, snapshot_summary
from agentkv.models.moe import MoEModel


@dataclass(frozen=True, slots=True)
class HybridConfig:
    """Which layers are recurrent, the DeltaNet shapes, the rotated dims, the MoE routing."""

    hparams: HParams
    recurrent_layers: tuple[bool, ...]
    delta: DeltaNetSpec
    rope_dim: int
    unit_offset: bool  # HF folders: gain 1 + w
    num_experts: int = 0
    experts_per_token: int = 0
    norm_topk: bool = True

    @classmethod
    def from_source(cls, source: ModelSource) -> HybridConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> HybridConfig:
        hp, raw = keys.hparams, keys.raw
        n = hp.num_layers
        if keys.gguf:
            interval = int(keys.get("full_attention_interval", None, 4))
            layers = tuple((i + 1) % interval != 0 for i in range(n))
            num_k = keys.get("ssm.group_count", None)
            num_v, dk = keys.get("ssm.time_step_rank", None), keys.get("ssm.state_size", None)
            inner, kernel = keys.get("ssm.inner_size", None), keys.get("ssm.conv_kernel", None)
            dv = None if inner is None or num_v is None else inner // num_v
            rope_dim = keys.get("rope.dimension_count", None, hp.head_dim)
        else:
            types = raw.get("layer_types") or [
                "full_attention" if (i + 1) % int(raw.get("full_attention_interval", 4)) == 0 else "linear_attention"
                for i in range(n)
            ]
            if len(types) != n:
                raise keys.error(f"layer_types has {len(types)} entries, expected num_hidden_layers={n}")
            layers = tuple(t == "linear_attention" for t in types)
            num_k, num_v = raw.get("linear_num_key_heads"), raw.get("linear_num_value_heads")
            dk, dv, kernel = (
                raw.get("linear_key_head_dim"),
                raw.get("linear_value_head_dim"),
                raw.get("linear_conv_kernel_dim", 4),
            )
            rope = raw.get("rope_parameters") or {}
            rope_dim = int(
                hp.head_dim * float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
            )
        shapes = {"num_k_heads": num_k, "num_v_heads": num_v, "head_k_dim": dk, "head_v_dim": dv, "conv_kernel": kernel}
        for name, value in shapes.items():
            if not isinstance(value, int) or value <= 0:
                raise keys.error(f"gated DeltaNet {name} is {value!r}; expected a positive integer")
        num_experts = int(keys.get("expert_count", "num_experts", 0) or 0)
        return cls(
            hp,
            layers,
            DeltaNetSpec(num_k, num_v, dk, dv, kernel, hp.norm_eps, *_layout(hp.arch, keys.gguf)),
            rope_dim=int(rope_dim),
            unit_offset=not keys.gguf,
            num_experts=num_experts,
            experts_per_token=int(keys.get("expert_used_count", "num_experts_per_tok", 0) or 0),
            norm_topk=bool(keys.get(None, "norm_topk_prob", True)),
        )

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports, with the two kinds of memory."""
        hp, d = self.hparams, self.delta
        num_attention = self.recurrent_layers.count(False)
        kv_token = 2 * num_attention * hp.num_kv_heads * hp.head_dim
        return {
            "layer_kinds": "".join("R" if r else "A" for r in self.recurrent_layers),
            "linear_heads_k_v": f"{d.num_k_heads}/{d.num_v_heads}",
            "linear_head_dims_k_v": f"{d.head_k_dim}/{d.head_v_dim}",
            **snapshot_summary(d.state_bytes * self.recurrent_layers.count(True)),
            "kv_bytes_per_token_f16": 2 * kv_token,
            "kv_bytes_per_token_f32": 4 * kv_token,
            "expert_count": self.num_experts,
            "experts_per_token": self.experts_per_token,
        }


def _layout(arch: str, gguf: bool) -> tuple[str, bool]:
    """How the DeltaNet projections come in this file (`DeltaNetSpec.layout`, `.tiled`): llama.cpp's
    converter splits qwen3next's qkvz into q|k|v and z, and tiles qwen35's value heads."""
    if arch == "qwen3next":
        return ("ba" if gguf else "qkvz"), False
    return "flat", gguf


class Mixer(NamedTuple):
    """One layer's token mixer: `projections` feed the DeltaNet (`slot_layer` its state layer)
    or, for attention, are (q|gate, k, v) with `norms` (q, k) and `slot_layer` its KV layer."""

    recurrent: bool
    projections: tuple[Weight, ...]
    out: Weight
    slot_layer: int
    weights: DeltaNetWeights | None = None
    norms: tuple[Weight, Weight] | None = None


class HybridModel(HybridMemory, MoEModel):
    """Qwen3-Next / Qwen3.5 text. Inherits only MoEModel's expert loading and its log line."""

    config_type = HybridConfig

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        Model.__init__(self, source, backend, options)
        hp, cfg = self.hparams, self.config
        rope = RopeSpec(dim=cfg.rope_dim, theta=hp.rope_theta, style=RopeStyle.NEOX, scaling=hp.rope_scaling)
        self.attention_spec = AttentionSpec(
            hp.num_heads, hp.num_kv_heads, hp.head_dim, rope, 1.0 / math.sqrt(hp.head_dim), None, hp.norm_eps,
            cfg.unit_offset,
        )  # fmt: skip
        self.moe_spec = MoEFFNSpec(cfg.num_experts, cfg.experts_per_token, cfg.norm_topk) if cfg.num_experts else None
        self.expert_formats: dict[str, tuple[int, int]] = {}
        self.embed = self.weight("token_embd.weight")
        counters = {True: 0, False: 0}
        self.mixers = []
        for i, recurrent in enumerate(cfg.recurrent_layers):
            self.mixers.append(self._mixer(i, recurrent, counters[recurrent]))
            counters[recurrent] += 1
        self.attn_norms = [self.weight(f"blk.{i}.attn_norm.weight") for i in range(hp.num_layers)]
        self.ffn_norms = [self.weight(f"blk.{i}.post_attention_norm.weight") for i in range(hp.num_layers)]
        self.ffns = [self._ffn(i) for i in range(hp.num_layers)]
        self.norm = self.weight("output_norm.weight")
        self.head = self.embed if hp.tie_embeddings else self.weight("output.weight")

    # -- loading ------------------------------------------------------------------------------
    def _mixer(self, i: int, recurrent: bool, slot_layer: int) -> Mixer:
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        if not recurrent:
            projections = (w("attn_q.weight"), w("attn_k.weight"), w("attn_v.weight"))
            norms = (w("attn_q_norm.weight"), w("attn_k_norm.weight"))
            return Mixer(False, projections, w("attn_output.weight"), slot_layer, norms=norms)
        names = {
            "qkvz": ("ssm_in.weight", "ssm_ba.weight"),
            "ba": ("attn_qkv.weight", "attn_gate.weight", "ssm_ba.weight"),
            "flat": ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight"),
        }[self.config.delta.layout]
        projections = tuple(w(name) for name in names)
        return Mixer(True, projections, w("ssm_out.weight"), slot_layer, weights=self._delta_weights(i))

    def _delta_weights(self, i: int) -> DeltaNetWeights:
        """The conv, decay, dt bias and gated-norm gain of layer i, as host f32 arrays."""
        src, spec, gguf = self.source, self.config.delta, self.source.kind == "gguf"
        host = lambda name: src.dequantized(name).astype(np.float32)  # noqa: E731
        a = host(f"blk.{i}.ssm_a").reshape(-1)
        dt_name = f"blk.{i}.ssm_dt.bias" if gguf else f"model.layers.{i}.linear_attn.dt_bias"
        return DeltaNetWeights(
            conv=np.ascontiguousarray(host(f"blk.{i}.ssm_conv1d.weight").reshape(spec.conv_dim, spec.conv_kernel)),
            a_neg=a if gguf else (-np.exp(a)).astype(np.float32),  # llama.cpp stores -exp(A_log)
            dt_bias=host(dt_name).reshape(-1),
            norm=host(f"blk.{i}.ssm_norm.weight").reshape(-1),
        )

    def _ffn(self, i: int) -> DenseFFN | MoEFFN:
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        norm = self.ffn_norms[i]
        if not self.source.has_tensor(f"blk.{i}.ffn_gate_inp.weight"):
            gate_up = Projection((w("ffn_gate.weight"), w("ffn_up.weight"))).fused(self.backend, f"blk.{i}.gate+up")
            return DenseFFN(norm, gate_up, w("ffn_down.weight"))
        shared = SharedExpert(
            Projection((w("ffn_gate_shexp.weight"), w("ffn_up_shexp.weight"))),
            w("ffn_down_shexp.weight"),
            self._row_weight(f"blk.{i}.ffn_gate_inp_shexp.weight"),
        )
        return MoEFFN(norm, w("ffn_gate_inp.weight"), self._experts(i), shared)

    # -- memory ---------------------------------------------------------------------------------
    @property
    def recurrent_spec(self):
        return self.config.delta

    # -- the step ---------------------------------------------------------------------------------
    def forward(self, token_ids: np.ndarray, meta: AttnMeta, kv, logit_rows: np.ndarray, states=None) -> Tensor:
        """`states`: the runner's StateStore (the recurrent layers read and write its slots)."""
        if states is None:
            raise ValueError(f"{self.hparams.arch}: a hybrid model's forward needs its StateStore (states=)")
        be, eps, uo = self.backend, self.hparams.norm_eps, self.config.unit_offset
        h = be.embedding(self.embed, token_ids)  # [n, d]
        x = be.rms_norm(h, self.attn_norms[0], eps, uo)
        for i, mixer in enumerate(self.mixers):
            h, x = be.add_norm(h, self._mix(mixer, x, meta, kv, states), self.ffn_norms[i], eps, uo)
            next_norm = self.attn_norms[i + 1] if i + 1 < len(self.mixers) else self.norm
            spec = self.moe_spec if isinstance(self.ffns[i], MoEFFN) else DenseFFNSpec("silu")
            h, x = be.add_norm(h, be.ffn(x, self.ffns[i], spec), next_norm, eps, uo)
        return be.matmul(be.take_rows(x, logit_rows), self.head)  # [rows, vocab]

    def _mix(self, mixer: Mixer, x: Tensor, meta: AttnMeta, kv, states: StateStore) -> Tensor:
        be = self.backend
        projected = be.matmuls(x, mixer.projections)
        if mixer.recurrent:
            core = delta_net(be, projected, mixer.weights, self.config.delta, states, mixer.slot_layer, meta)
            return be.matmul(core, mixer.out)
        a = self.attention_spec
        q, gate = gate_heads(be, projected[0], a.num_heads, a.head_dim)
        q = be.attention_inputs([q, *projected[1:]], meta, kv, mixer.slot_layer, a, *mixer.norms)
        out = be.attention(q, kv, mixer.slot_layer, meta, a.scale)
        out = sigmoid_gate(be, be.reshape(out, (q.shape[0], a.num_heads * a.head_dim)), gate)
        return be.matmul(out, mixer.out)
