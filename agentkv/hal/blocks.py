"""Typed decoder-block weights and specs: what `Backend.decoder_block` consumes.

A layer is attention + FFN, and the FFN part is replaceable on its own: the block op
composes attention with `ffn_op(layer.ffn, ...)`, which dispatches on the FFN weights' type.
Dense gated FFNs are registered here; a new kind (MoE, LoRA deltas) is a new weights type
plus one `@ffn_op.register` function, and attention never changes.

    DecoderLayer
      attention: AttentionWeights   norm, qkv (fused or parts, biases), q/k norms, o, post norm
      ffn:       DenseFFN | MoEFFN  norm, gate|up (fused or parts), down, post norm
                                    | norm, router, per-expert gate/up/down, shared expert
    BlockSpec
      attention: AttentionSpec      heads, kv heads, head dim, rope, scale, window, eps, offset
      ffn:       DenseFFNSpec | MoEFFNSpec   activation | experts, top-k, renormalisation
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import singledispatch
from typing import TYPE_CHECKING, Any

from agentkv.hal.base import RopeSpec, Tensor, Weight

if TYPE_CHECKING:
    from collections.abc import Sequence

    from agentkv.hal.base import Backend

GATED_ACTS = ("silu", "gelu_tanh", "gelu")


class MissingWeight(ValueError):
    """A typed layer was built without a weight it cannot run without."""


def _require(obj: Any, *names: str) -> None:
    """Raise MissingWeight naming the first of `names` on `obj` that is not a Weight."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, Weight):
            raise MissingWeight(f"{type(obj).__name__}.{name}: a required weight is missing (got {value!r})")


# ------------------------------------------------------------------------------- specs


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """Causal GQA attention of one layer. `scale` multiplies the scores (None: 1/sqrt(head_dim));
    `window` keeps the last `window` positions (None: full attention); `eps` and `unit_offset`
    are the layer's RMSNorm settings (the q/k norms' and the block's residual norms')."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeSpec
    scale: float | None = None
    window: int | None = None
    eps: float = 1e-6
    unit_offset: bool = False  # norm gain is 1 + w (gemma)

    def __post_init__(self):
        for name in ("num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"AttentionSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"AttentionSpec.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rope.dim > self.head_dim:
            raise ValueError(f"AttentionSpec.rope.dim={self.rope.dim} exceeds head_dim={self.head_dim}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"AttentionSpec.window must be > 0 or None, got {self.window}")
        if self.scale is None:
            object.__setattr__(self, "scale", 1.0 / math.sqrt(self.head_dim))

    @property
    def qkv_sizes(self) -> list[int]:
        """Column widths of the stacked projection: | q: h * hd | k: kvh * hd | v: kvh * hd |."""
        kv = self.num_kv_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv, kv]


@dataclass(frozen=True, slots=True)
class DenseFFNSpec:
    """A dense gated FFN: `down(act(gate) * up)`."""

    act: str  # "silu" | "gelu_tanh" | "gelu"

    def __post_init__(self):
        if self.act not in GATED_ACTS:
            raise ValueError(f"DenseFFNSpec.act must be one of {GATED_ACTS}, got {self.act!r}")


@dataclass(frozen=True, slots=True)
class MoEFFNSpec:
    """A routed mixture of gated experts: `top_k` of `num_experts` per token, chosen on the
    router's softmax. `softmax_after_topk` takes the top-k logits first and softmaxes only
    those; `norm_topk` rescales the chosen probabilities to sum to 1; `weights_scale`
    multiplies them last. The shared expert, where the weights have one, is always added."""

    num_experts: int
    top_k: int
    norm_topk: bool
    act: str = "silu"
    softmax_after_topk: bool = False
    weights_scale: float = 1.0
    # DeepSeek / GLM routing (hal/routing.py): sigmoid scores, group-limited choice
    scoring: str = "softmax"  # "softmax" | "sigmoid"
    num_groups: int = 1
    top_groups: int = 1
    group_score: str = "top2"  # a group's score: "max" (DeepSeek-V2) | "top2" (sum of its best 2)

    def __post_init__(self):
        from agentkv.hal.routing import GROUP_SCORES, SCORINGS

        if self.scoring not in SCORINGS or self.group_score not in GROUP_SCORES:
            raise ValueError(f"MoEFFNSpec.scoring={self.scoring!r} / group_score={self.group_score!r} unknown")
        if self.num_groups <= 0 or self.num_experts % self.num_groups or not 0 < self.top_groups <= self.num_groups:
            raise ValueError(
                f"MoEFFNSpec.num_groups={self.num_groups} must divide num_experts={self.num_experts}, "
                f"and top_groups={self.top_groups} be in 1..num_groups"
            )
        if self.num_experts <= 0:
            raise ValueError(f"MoEFFNSpec.num_experts must be > 0, got {self.num_experts}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"MoEFFNSpec.top_k must be in 1..num_experts={self.num_experts}, got {self.top_k}")
        if self.act not in GATED_ACTS:
            raise ValueError(f"MoEFFNSpec.act must be one of {GATED_ACTS}, got {self.act!r}")


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """What varies between the pre-norm decoder blocks of the llama family and gemma3."""

    attention: AttentionSpec
    ffn: Any  # DenseFFNSpec, or the spec of another FFN kind

    @property
    def eps(self) -> float:
        return self.attention.eps

    @property
    def unit_offset(self) -> bool:
        return self.attention.unit_offset


# ----------------------------------------------------------------------------- weights


@dataclass(frozen=True, slots=True)
class Projection:
    """`x @ W.T (+ b)` for weights that read the same input, outputs side by side: one fused
    weight (one matmul) or its parts (one matmul each). `biases` has one entry per weight."""

    weights: tuple[Weight, ...]
    biases: tuple[Weight | None, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "weights", tuple(self.weights))
        object.__setattr__(self, "biases", tuple(self.biases) or (None,) * len(self.weights))
        if not self.weights:
            raise MissingWeight("Projection: needs at least one weight, got none")
        for i, w in enumerate(self.weights):
            if not isinstance(w, Weight):
                raise MissingWeight(f"Projection.weights[{i}]: a required weight is missing (got {w!r})")
        if len(self.biases) != len(self.weights):
            raise ValueError(f"Projection: {len(self.biases)} biases for {len(self.weights)} weights")

    @property
    def mixed_biases(self) -> bool:
        """Some parts have a bias and others not (such parts are never joined into one)."""
        return any(b is None for b in self.biases) and any(b is not None for b in self.biases)

    def fused(self, backend: Backend, name: str) -> Projection:
        """This projection as one stacked weight where the backend fuses rows (never changes a
        column's bits), else itself."""
        if len(self.weights) == 1 or self.mixed_biases:
            return self
        weight = backend.fuse_rows(list(self.weights), name)
        bias = None if self.biases[0] is None else backend.fuse_rows(list(self.biases), name + "_bias")
        if weight is None or (self.biases[0] is not None and bias is None):
            return self
        return Projection((weight,), (bias,))


@dataclass(frozen=True, slots=True)
class AttentionWeights:
    """One layer's attention: `norm` is its input RMSNorm (applied by the previous block's
    last add_norm), `qkv` the q/k/v projection, optional per-head `q_norm`/`k_norm` `[hd]`,
    `o` the output projection, optional `post_norm` on its output (gemma3's sandwich)."""

    norm: Weight
    qkv: Projection
    o: Weight
    q_norm: Weight | None = None
    k_norm: Weight | None = None
    post_norm: Weight | None = None

    def __post_init__(self):
        _require(self, "norm", "o")
        if not isinstance(self.qkv, Projection):
            raise MissingWeight(f"AttentionWeights.qkv: a required projection is missing (got {self.qkv!r})")
        if len(self.qkv.weights) not in (1, 3):
            raise ValueError(f"AttentionWeights.qkv: fused q+k+v or its 3 parts, got {len(self.qkv.weights)} weights")


@dataclass(frozen=True, slots=True)
class DenseFFN:
    """A dense gated FFN: `norm` its input RMSNorm, `gate_up` the gate and up projections
    (fused: gate columns first), `down`, optional `post_norm` on its output (gemma3)."""

    norm: Weight
    gate_up: Projection
    down: Weight
    post_norm: Weight | None = None

    def __post_init__(self):
        _require(self, "norm", "down")
        if not isinstance(self.gate_up, Projection):
            raise MissingWeight(f"DenseFFN.gate_up: a required projection is missing (got {self.gate_up!r})")
        if len(self.gate_up.weights) not in (1, 2):
            raise ValueError(f"DenseFFN.gate_up: fused gate+up or its 2 parts, got {len(self.gate_up.weights)} weights")


@dataclass(frozen=True, slots=True)
class Experts:
    """The routed experts of one layer, one Weight per expert and projection: `gate[e]`,
    `up[e]` `[f, d]` and `down[e]` `[d, f]`. Each is a view of the file's 3-D expert tensor
    (a GGUF's quant blocks stay as they are) or the expert's own safetensors tensor."""

    gate: tuple[Weight, ...]
    up: tuple[Weight, ...]
    down: tuple[Weight, ...]

    def __post_init__(self):
        for name in ("gate", "up", "down"):
            ws = tuple(getattr(self, name))
            object.__setattr__(self, name, ws)
            for e, w in enumerate(ws):
                if not isinstance(w, Weight):
                    raise MissingWeight(f"Experts.{name}[{e}]: a required weight is missing (got {w!r})")
        if not len(self.gate) == len(self.up) == len(self.down) > 0:
            raise ValueError(
                f"Experts: {len(self.gate)} gate, {len(self.up)} up and {len(self.down)} "
                "down weights; each expert needs all three"
            )

    @property
    def num_experts(self) -> int:
        return len(self.gate)


@dataclass(frozen=True, slots=True)
class SharedExpert:
    """The expert every token runs (qwen2moe): a dense gated FFN whose output is scaled by
    `sigmoid(x @ gate[0])` when `gate` is present. `gate` is `[r, d]`, r copies of the gate
    row (`tiled_gate`): a one-column GEMM is not row-invariant in MKL, a 16-column one is."""

    gate_up: Projection
    down: Weight
    gate: Weight | None = None

    def __post_init__(self):
        _require(self, "down")
        if not isinstance(self.gate_up, Projection) or len(self.gate_up.weights) not in (1, 2):
            raise MissingWeight(f"SharedExpert.gate_up: fused gate+up or its 2 parts, got {self.gate_up!r}")


@dataclass(frozen=True, slots=True)
class MoEFFN:
    """A mixture-of-experts FFN: `norm` its input RMSNorm, `router` `[num_experts, d]`,
    the routed `experts`, an optional `shared` expert, optional `post_norm` on its output,
    an optional `score_bias` (DeepSeek-V3's e_score_correction_bias, f32)."""

    norm: Weight
    router: Weight
    experts: Experts
    shared: SharedExpert | None = None
    post_norm: Weight | None = None
    score_bias: Weight | None = None  # `[num_experts]` added to the scores for the choice only

    def __post_init__(self):
        _require(self, "norm", "router")
        if not isinstance(self.experts, Experts):
            raise MissingWeight(f"MoEFFN.experts: expected Experts, got {self.experts!r}")
        if self.router.shape[0] != self.experts.num_experts:
            raise ValueError(f"MoEFFN.router has {self.router.shape[0]} rows for {self.experts.num_experts} experts")


@dataclass(frozen=True, slots=True)
class DecoderLayer:
    """A decoder layer: attention, then an FFN of any registered kind. Every FFN kind has a
    `norm` (its input RMSNorm) and an optional `post_norm`, which the block's add_norms use."""

    attention: AttentionWeights
    ffn: Any  # DenseFFN, or the weights of another FFN kind registered with ffn_op

    def __post_init__(self):
        if not isinstance(self.attention, AttentionWeights):
            raise MissingWeight(f"DecoderLayer.attention: expected AttentionWeights, got {self.attention!r}")
        if not isinstance(getattr(self.ffn, "norm", None), Weight):
            raise MissingWeight(f"DecoderLayer.ffn: {type(self.ffn).__name__} has no norm weight")


def next_norms(layers: Sequence[DecoderLayer], final_norm: Weight) -> list[Weight]:
    """The norm each block ends in: the next layer's attention norm, the last block's `final_norm`."""
    return [layer.attention.norm for layer in layers[1:]] + [final_norm]


def weights_of(obj: Any) -> dict[str, Weight | None]:
    """The Weight fields of a typed layer part, by field name (for logs and tests)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if not isinstance(getattr(obj, f.name), Projection)}


# ------------------------------------------------------------------------- the FFN seam


@singledispatch
def ffn_op(weights: Any, backend: Backend, x: Tensor, spec: Any) -> Tensor:
    """The FFN of `weights`' kind on its normed input `x` `[n, d]` -> `[n, d]` (before any
    post norm). Dispatches on the weights' type; a new FFN kind registers its function."""
    raise TypeError(f"no FFN op is registered for {type(weights).__name__} (spec {spec!r})")


@ffn_op.register(DenseFFN)
def _dense_ffn(weights: DenseFFN, backend: Backend, x: Tensor, spec: DenseFFNSpec) -> Tensor:
    if not isinstance(spec, DenseFFNSpec):
        raise TypeError(f"a DenseFFN needs a DenseFFNSpec, got {spec!r}")
    act = backend.glu(project(backend, x, weights.gate_up), spec.act)
    return backend.matmul(act, weights.down)


@ffn_op.register(MoEFFN)
def _moe_ffn(weights: MoEFFN, backend: Backend, x: Tensor, spec: MoEFFNSpec) -> Tensor:
    if not isinstance(spec, MoEFFNSpec):
        raise TypeError(f"a MoEFFN needs a MoEFFNSpec, got {spec!r}")
    if spec.num_experts != weights.experts.num_experts:
        raise ValueError(
            f"MoEFFNSpec.num_experts={spec.num_experts} but the layer has {weights.experts.num_experts} experts"
        )
    return backend.moe_ffn(x, weights, spec)


GATE_COPIES = 16  # rows of a tiled one-row gate (MKL sgemm is row-invariant from 16 columns)


def tiled_gate(backend: Backend, gate: Weight) -> Weight:
    """A `[1, d]` gate as GATE_COPIES identical rows where the backend stacks rows, else itself."""
    return backend.fuse_rows([gate] * GATE_COPIES, gate.name) or gate


def shared_expert(backend: Backend, x: Tensor, shared: SharedExpert, act: str) -> tuple[Tensor, Tensor | None]:
    """The shared expert's output `[n, d]` and its gate's logit `[n, 1]` (None: ungated)."""
    out = backend.matmul(backend.glu(project(backend, x, shared.gate_up), act), shared.down)
    if shared.gate is None:
        return out, None
    logits = backend.matmul(x, shared.gate)
    rows = shared.gate.shape[0]
    return out, logits if rows == 1 else backend.split(logits, [1, rows - 1])[0]


def project(backend: Backend, x: Tensor, proj: Projection) -> Tensor | list[Tensor]:
    """`x @ W.T (+ b)` for each weight of `proj`. A fused projection's output stays one
    `[n, sum(sizes)]` tensor (one matmul), the form the fused ops take (`Backend.glu`,
    `Backend.attention_inputs`); an unfused one gives its parts as a list (`Backend.matmuls`:
    each with one matmul's bits), which those ops accept too."""
    if len(proj.weights) == 1:
        return backend.matmul(x, proj.weights[0], proj.biases[0])
    return backend.matmuls(x, proj.weights, proj.biases)
