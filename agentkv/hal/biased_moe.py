"""gpt-oss's mixture of experts as an FFN kind: a router with a bias, experts with biases and
the clamped SwiGLU. Registered with `hal.blocks.ffn_op`, so attention and the block never
change; the family (models/gpt_oss.py) builds `BiasedMoEFFN` weights and a `BiasedMoEFFNSpec`.

    logits = x @ router.T + router_bias                  top-k logits, softmax over those k
    per chosen expert e:  g = x @ gate[e].T + bg[e]      u = x @ up[e].T + bu[e]
        g = min(g, limit);  u = clip(u, -limit, limit);  y = (u + 1) * g * sigmoid(alpha * g)
        out += p_e * (y @ down[e].T + bd[e])             summed in the token's own rank order

Batch invariance as for `Backend.moe_ffn`: every matmul is the backend's own (row-invariant),
the activation is elementwise, and each token sums its experts in its rank order, so a token's
bits never depend on the other tokens of its batch or chunk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentkv.hal.base import Backend, Tensor, Weight
from agentkv.hal.blocks import Experts, MissingWeight, MoEFFNSpec, ffn_op


@dataclass(frozen=True, slots=True)
class BiasedMoEFFNSpec:
    """`top_k` of `num_experts` per token; the clamped SwiGLU's sigmoid gain `alpha` and clamp `limit`."""

    num_experts: int
    top_k: int
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"BiasedMoEFFNSpec.top_k must be in 1..num_experts={self.num_experts}, got {self.top_k}")
        if self.limit <= 0:
            raise ValueError(f"BiasedMoEFFNSpec.limit must be > 0, got {self.limit}")

    @property
    def routing(self) -> MoEFFNSpec:
        """How tokens are routed: the top-k logits first, then a softmax over only those."""
        return MoEFFNSpec(self.num_experts, self.top_k, norm_topk=False, softmax_after_topk=True)


@dataclass(frozen=True, slots=True)
class BiasedMoEFFN:
    """`norm` the FFN's input RMSNorm, `router` `[E, d]` and its `router_bias` `[E]`, the
    `experts`, and their biases per expert: `gate_bias[e]`, `up_bias[e]` `[f]`, `down_bias[e]` `[d]`."""

    norm: Weight
    router: Weight
    router_bias: Weight
    experts: Experts
    gate_bias: tuple[Weight, ...]
    up_bias: tuple[Weight, ...]
    down_bias: tuple[Weight, ...]
    post_norm: Weight | None = None

    def __post_init__(self):
        for name in ("norm", "router", "router_bias"):
            if not isinstance(getattr(self, name), Weight):
                raise MissingWeight(f"BiasedMoEFFN.{name}: a required weight is missing")
        for name in ("gate_bias", "up_bias", "down_bias"):
            if len(getattr(self, name)) != self.experts.num_experts:
                raise ValueError(
                    f"BiasedMoEFFN.{name} has {len(getattr(self, name))} entries for {self.experts.num_experts} experts"
                )


@ffn_op.register(BiasedMoEFFN)
def _biased_moe(weights: BiasedMoEFFN, backend: Backend, x: Tensor, spec: BiasedMoEFFNSpec) -> Tensor:
    if not isinstance(spec, BiasedMoEFFNSpec):
        raise TypeError(f"a BiasedMoEFFN needs a BiasedMoEFFNSpec, got {spec!r}")
    own = getattr(backend, "biased_moe_ffn", None)  # a backend's own dispatch (`cuda`: grouped launches)
    if own is not None:
        return own(x, weights, spec)
    logits = backend.matmul(x, weights.router, weights.router_bias)  # [n, E]
    if isinstance(x.raw, np.ndarray):
        return _per_token(backend, x, weights, spec, logits.raw)
    return grouped_biased_moe(backend, x, weights, spec, logits.raw)


def clamped_swiglu_np(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """`(clip(up, ±limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)`, in f32."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, np.float32(-limit), np.float32(limit))
    return (u + np.float32(1.0)) * (g / (np.float32(1.0) + np.exp(-np.float32(alpha) * g)))


def clamped_swiglu_torch(gate, up, alpha: float, limit: float):
    """`clamped_swiglu_np` on torch tensors, elementwise (exp: no scalar tail of its own)."""
    import torch

    g, u = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (u + 1.0) * (g / (1.0 + torch.exp(-alpha * g)))


def _per_token(backend: Backend, x: Tensor, w: BiasedMoEFFN, spec: BiasedMoEFFNSpec, logits) -> Tensor:
    """The reference's plain loop: each token, its experts in rank order, GEMVs."""
    from agentkv.hal.reference import route_row

    xs = np.ascontiguousarray(x.raw)
    ex, out = w.experts, np.zeros_like(xs)
    for t in range(xs.shape[0]):
        chosen, probs = route_row(logits[t], spec.routing)
        for e, p in zip(chosen, probs):
            gate = ex.gate[e].raw @ xs[t] + w.gate_bias[e].raw
            up = ex.up[e].raw @ xs[t] + w.up_bias[e].raw
            hidden = clamped_swiglu_np(gate, up, spec.alpha, spec.limit)
            out[t] += p * (ex.down[e].raw @ hidden + w.down_bias[e].raw)
    return Tensor(out)


def grouped_biased_moe(backend: Backend, x: Tensor, w: BiasedMoEFFN, spec: BiasedMoEFFNSpec, logits) -> Tensor:
    """Torch tensors (`torch`, `cpu`): the rows routed to each expert in one matmul per
    projection, outputs into one slot per (token, rank), summed per token in rank order
    (as hal/portable/moe.py's `grouped_moe`)."""
    import torch

    from agentkv.hal.portable.moe import expert_slots, rank_weighted, route

    chosen, probs = route(logits, spec.routing)
    ex = w.experts

    def run_expert(e: int, rows: Tensor, _tokens) -> torch.Tensor:
        gate = backend.matmul(rows, ex.gate[e], w.gate_bias[e]).raw
        up = backend.matmul(rows, ex.up[e], w.up_bias[e]).raw
        hidden = clamped_swiglu_torch(gate, up, spec.alpha, spec.limit)
        return backend.matmul(Tensor(hidden), ex.down[e], w.down_bias[e]).raw

    return Tensor(rank_weighted(expert_slots(x.raw, chosen, spec.num_experts, run_expert), probs))
