"""LoRA on an MoE layer's routed experts: the backend's own expert dispatch, in which each
expert matmul then adds, per row, the delta of the adapter that row's token uses for that
expert (`Backend.lora_add` over the rows routed to the expert, with their tokens' slots).

Order is fixed per token: routing as the base computes it; for each of the token's top-k
experts the gate, up and down outputs each get their delta right after the base matmul; the
expert outputs are summed in the token's rank order. A row's delta depends only on its own
input and adapter, and a row of the base is never written, so the contract of `hal/lora.py`
holds: no row's bits depend on its neighbours' adapters, nor on which experts they chose.

    torch backends (cpu, torch): `grouped_moe` (tokens grouped by expert), whose bits equal the
        cpu backend's compiled experts for base rows
    reference (numpy): its per-token loop of GEMVs
"""

from __future__ import annotations

import numpy as np

from agentkv.hal.base import Backend, Tensor
from agentkv.hal.blocks import MoEFFN, MoEFFNSpec


def experts_adapted(weights: MoEFFN, pieces) -> bool:
    """Whether any routed expert of this layer has pieces in the step (`LoraStep.pieces`)."""
    ex = weights.experts
    return any(w.name in pieces for bank in (ex.gate, ex.up, ex.down) for w in bank)


def lora_moe_ffn(backend: Backend, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec, step) -> Tensor:
    """`Backend.moe_ffn` with the step's (`hal.lora.LoraStep`) expert adapters added."""
    if isinstance(x.raw, np.ndarray):
        return _numpy_moe(backend, x, weights, spec, step)
    from agentkv.hal.portable.moe import grouped_moe

    def matmul(rows: Tensor, weight, tokens) -> Tensor:
        y = backend.matmul(rows, weight)
        pieces = step.pieces.get(weight.name)
        if not pieces:
            return y
        slots = step.row_slots[tokens.numpy()]
        return backend.lora_add(rows, y, slots, pieces) if (slots >= 0).any() else y

    return grouped_moe(backend, x, weights, spec, expert_matmul=matmul)


def _numpy_moe(backend: Backend, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec, step) -> Tensor:
    """The reference backend's per-token loop (`ReferenceBackend.moe_ffn`) with the deltas."""
    from agentkv.hal.reference import ACTIVATIONS, route_row

    xs = np.ascontiguousarray(x.raw)
    logits = backend.matmul(x, weights.router).raw
    act, ex = ACTIVATIONS[spec.act], weights.experts
    out = np.zeros_like(xs)

    def project(w, v: np.ndarray, t: int) -> np.ndarray:
        y = (w.raw @ v)[None]
        pieces = step.pieces.get(w.name)
        if pieces:
            backend.lora_add(Tensor(v[None]), Tensor(y), step.row_slots[t : t + 1], pieces)
        return y[0]

    for t in range(xs.shape[0]):
        chosen, probs = route_row(logits[t], spec)
        for e, p in zip(chosen, probs):
            hidden = act(project(ex.gate[e], xs[t], t)) * project(ex.up[e], xs[t], t)
            out[t] += p * project(ex.down[e], np.ascontiguousarray(hidden), t)
    if weights.shared is not None:
        from agentkv.hal.blocks import shared_expert

        shared, gate = shared_expert(backend, x, weights.shared, spec.act)
        scale = np.float32(1.0) if gate is None else np.float32(1.0) / (np.float32(1.0) + np.exp(-gate.raw))
        out = out + scale * shared.raw
    return Tensor(out)
