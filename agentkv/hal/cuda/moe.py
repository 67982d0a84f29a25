"""The `cuda` backend's expert dispatch, without a host read: the portable dispatch
(hal/portable/moe.py) counts each expert's tokens on the host to slice them, a sync per MoE
layer on a device. Here the routed rows are sorted by expert on the device, and one grouped
launch per projection runs every expert's rows (`grouped_matmul_kernel`), its grid sized by
an upper bound the host knows (`cdiv(rows, BM) + E` tiles) rather than by the counts.

    slots:   | token 0: rank 0 .. rank k-1 | token 1: ... |      (slot s = token * k + rank)
    sorted:  | expert 0's slots | expert 1's slots | ...     (a stable sort of the chosen ids)

Each slot's output row depends only on its token's row and its expert's weight, and each
token sums its slots in rank order (as the portable dispatch does), so a token's bits never
depend on which tokens share its batch. The experts' weights are stacked once per layer on
first use (each expert's Weight then views its part, so memory is not doubled).
"""

from __future__ import annotations

import torch

from agentkv.hal.base import Layout, Tensor, Weight
from agentkv.hal.blocks import Experts, MoEFFN, MoEFFNSpec
from agentkv.hal.cuda import launch
from agentkv.hal.portable.moe import add_shared, rank_weighted, route, score_bias


def stack(ws: tuple[Weight, ...], name: str) -> Weight:
    """One Weight `[E * n, k]` holding the experts' weights back to back; each expert's
    `raw` becomes a view of its rows (its old storage is freed with its last reference)."""
    first = ws[0]
    if any(w.qtype != first.qtype or w.shape != first.shape for w in ws):
        raise ValueError(f"{name}: experts of mixed types or shapes cannot be stacked: {ws}")
    stacked = torch.stack([w.raw for w in ws]).reshape(len(ws) * first.raw.shape[0], -1)
    for e, w in enumerate(ws):
        w.raw = stacked[e * first.raw.shape[0] : (e + 1) * first.raw.shape[0]]
    shape = (len(ws) * first.shape[0], first.shape[1])
    layout = Layout.ROW_MAJOR_F32 if first.qtype == 0 else Layout.GGUF_ROWS
    return Weight(stacked, shape, first.qtype, name, layout=layout)


def stacked_experts(backend, experts: Experts) -> tuple[Weight, Weight, Weight]:
    """The layer's (gate, up, down) stacks, built on first use and kept while the backend lives."""
    memo = backend.__dict__.setdefault("_stacked_experts", {})
    entry = memo.get(id(experts))
    if entry is None or entry[0] is not experts:
        parts = tuple(stack(getattr(experts, p), f"experts.{p}") for p in ("gate", "up", "down"))
        entry = memo[id(experts)] = (experts, parts)
    return entry[1]


def moe_ffn(backend, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec) -> Tensor:
    """`Backend.moe_ffn` with grouped launches: see the module docstring. x `[n, d]` -> `[n, d]`."""
    chosen, probs = route(backend.matmul(x, weights.router).raw, spec, score_bias(weights))

    def act(gate_rows, up_rows):
        return backend.glu([Tensor(gate_rows), Tensor(up_rows)], spec.act).raw

    out = _routed(backend, x.raw, weights.experts, chosen, probs, act)
    return add_shared(backend, x, weights, spec, out)


def biased_moe_ffn(backend, x: Tensor, weights, spec) -> Tensor:
    """gpt-oss's FFN kind (hal/biased_moe.py: router and expert biases, the clamped SwiGLU)
    with the same grouped launches; the biases ride in the kernel's epilogue."""
    from agentkv.hal.biased_moe import clamped_swiglu_torch

    chosen, probs = route(backend.matmul(x, weights.router, weights.router_bias).raw, spec.routing)

    def act(gate_rows, up_rows):
        return clamped_swiglu_torch(gate_rows, up_rows, spec.alpha, spec.limit)

    biases = tuple(stacked_biases(backend, weights, p) for p in ("gate_bias", "up_bias", "down_bias"))
    return Tensor(_routed(backend, x.raw, weights.experts, chosen, probs, act, biases))


def stacked_biases(backend, weights, part: str) -> torch.Tensor:
    """The experts' biases of one projection as f32 `[E, n]`, built on first use."""
    memo = backend.__dict__.setdefault("_stacked_biases", {})
    key = (id(weights), part)
    entry = memo.get(key)
    if entry is None or entry[0] is not weights:
        entry = memo[key] = (weights, torch.stack([b.raw.to(torch.float32) for b in getattr(weights, part)]))
    return entry[1]


def _routed(backend, xs: torch.Tensor, experts: Experts, chosen, probs, act, biases=(None, None, None)):
    """The routed experts' weighted sum `[n, d]` (each token's slots in rank order); `act`
    turns (gate rows, up rows) into the down projection's input."""
    n, k = chosen.shape
    num_experts = experts.num_experts
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    where = launch.expert_tiles(backend.tiles, flat[order], num_experts)
    gate, up, down = stacked_experts(backend, experts)
    rows = xs.index_select(0, order // k)
    gate_rows = launch.grouped_matmul(backend.tiles, rows, gate, num_experts, where, biases[0])
    up_rows = launch.grouped_matmul(backend.tiles, rows, up, num_experts, where, biases[1])
    hidden = act(gate_rows, up_rows)
    slots_out = torch.empty((n * k, xs.shape[1]), dtype=torch.float32, device=xs.device)
    slots_out.index_copy_(0, order, launch.grouped_matmul(backend.tiles, hidden, down, num_experts, where, biases[2]))
    return rank_weighted(slots_out, probs)
