"""LoRA as data attached to a block's projection weights: the pieces an adapter adds to a
weight's output columns, a step's per-row adapter slots, and the decoder stack that adds them.

A step whose rows use adapters runs every block through the base class's composition
(`Backend.decoder_block`) on a `LoraView` of the backend: the same ops in the same order as
the compiled block (whose bits the composition equals), except that a matmul against a
weight some adapter of the step targets then adds, per row, `scale * (x @ A^T) @ B^T` into
that weight's output columns (`Backend.lora_add`). A row without an adapter is never written,
and a row's delta depends only on its own input and adapter, so no row's bits depend on its
neighbours' adapters or on how many rows ride along.

    fused q+k+v output  | q: h*hd            | k: kvh*hd | v: kvh*hd |
    pieces (one slot)   | col 0, out h*hd    |           | col (h+kvh)*hd, out kvh*hd |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from agentkv.hal.base import Backend, Tensor, Weight
from agentkv.hal.blocks import BlockSpec, DecoderLayer, Projection

KINDS = ("q", "k", "v", "o", "gate", "up", "down")


class LoraPiece(NamedTuple):
    """One adapter's pair for one projection: `a` `[r, in]`, `bt` (B transposed) `[r, out]`,
    added as `scale * (x @ A^T) @ B^T` into columns [col, col + out) of the weight's output
    for the rows whose slot is `slot`."""

    slot: int
    a: Weight
    bt: Weight
    scale: float
    col: int


class LoraStep(NamedTuple):
    """A step's adapters: `row_slots` int32 `[n]` (the row's adapter slot, -1: the base), the
    pieces of every slot by the base weight's name they attach to, and the adapter objects
    that own the slots (opaque here; a later step with the same owners reuses the pieces)."""

    row_slots: np.ndarray
    pieces: Mapping[str, tuple[LoraPiece, ...]]
    owners: tuple = ()


class Target(NamedTuple):
    """Where a projection kind's output lives: the weight that computes it and its columns."""

    weight: Weight
    col: int
    out: int
    inp: int


def targets(layer: DecoderLayer, spec: BlockSpec) -> dict[str, Target]:
    """Each projection kind of a dense decoder layer -> the weight and columns holding its
    output (a fused q+k+v or gate+up weight holds several kinds side by side)."""
    found: dict[str, Target] = {}
    _add(found, layer.attention.qkv, ("q", "k", "v"), spec.attention.qkv_sizes)
    o = layer.attention.o
    found["o"] = Target(o, 0, o.shape[0], o.shape[1])
    ffn = layer.ffn
    gate_up, down = getattr(ffn, "gate_up", None), getattr(ffn, "down", None)
    if isinstance(gate_up, Projection) and isinstance(down, Weight):
        rows = [w.shape[0] for w in gate_up.weights]
        _add(found, gate_up, ("gate", "up"), rows if len(rows) == 2 else [rows[0] // 2] * 2)
        found["down"] = Target(down, 0, down.shape[0], down.shape[1])
    return found


def expert_target(layer: DecoderLayer, kind: str, expert: int) -> Target | None:
    """Routed expert `expert`'s gate, up or down weight in an MoE layer (None: no such expert)."""
    experts = getattr(layer.ffn, "experts", None)
    if experts is None or kind not in ("gate", "up", "down") or not 0 <= expert < experts.num_experts:
        return None
    w = getattr(experts, kind)[expert]
    return Target(w, 0, w.shape[0], w.shape[1])


def _add(found: dict[str, Target], proj: Projection, kinds: Sequence[str], sizes: Sequence[int]) -> None:
    if len(proj.weights) == len(kinds):
        for kind, w in zip(kinds, proj.weights):
            found[kind] = Target(w, 0, w.shape[0], w.shape[1])
        return
    col, w = 0, proj.weights[0]
    for kind, size in zip(kinds, sizes):
        found[kind] = Target(w, col, size, w.shape[1])
        col += size


class LoraView:
    """The backend as a step with adapter rows sees it: every op is the backend's own, except
    `matmul`, which adds the step's pieces for the weight it multiplies, and the composed ops
    that call matmul (`matmuls`, `decoder_block`, `ffn`), which run the base class's composition on this
    view so that their matmuls come back here; `moe_ffn` adds the routed experts' adapters."""

    def __init__(self, backend: Backend, step: LoraStep):
        self._backend, self._step = backend, step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        y = self._backend.matmul(x, weight, bias)
        pieces = self._step.pieces.get(weight.name)
        return self._backend.lora_add(x, y, self._step.row_slots, pieces) if pieces else y

    def matmuls(self, x: Tensor, weights: Any, biases: Any = ()) -> list[Tensor]:
        return Backend.matmuls(self, x, weights, biases)  # type: ignore[arg-type]

    def ffn(self, x: Tensor, weights: Any, spec: Any) -> Tensor:
        return Backend.ffn(self, x, weights, spec)  # type: ignore[arg-type]

    def moe_ffn(self, x: Tensor, weights: Any, spec: Any) -> Tensor:
        """The backend's MoE FFN, or where the step adapts this layer's experts, its dispatch
        with each expert matmul's deltas added (hal/lora_moe.py)."""
        from agentkv.hal.lora_moe import experts_adapted, lora_moe_ffn

        if experts_adapted(weights, self._step.pieces):
            return lora_moe_ffn(self._backend, x, weights, spec, self._step)
        return self._backend.moe_ffn(x, weights, spec)

    def decoder_block(self, *args: Any) -> tuple[Tensor, Tensor]:
        return Backend.decoder_block(self, *args)  # type: ignore[arg-type]

    def decoder_blocks(self, *args: Any) -> tuple[Tensor, Tensor]:
        """`Backend.decoder_blocks(h, x, layers, specs, meta, kv, final_norm)`, block by block
        through this view (so never the backend's compiled stack)."""
        return Backend.decoder_blocks(self, *args)  # type: ignore[arg-type]


def lora_add_rows(x: np.ndarray, y: np.ndarray, row_slots: np.ndarray, pieces: Sequence[LoraPiece], raw) -> None:
    """`Backend.lora_add` in numpy (the reference and portable backends): one GEMV per row and
    piece, so a row's bits never see the batch. `raw(weight)` gives a piece weight's numpy
    array (mutates y)."""
    for i in np.flatnonzero(row_slots >= 0):
        for p in pieces:
            if p.slot == row_slots[i]:
                bt = raw(p.bt)
                y[i, p.col : p.col + bt.shape[1]] += np.float32(p.scale) * ((raw(p.a) @ x[i]) @ bt)
