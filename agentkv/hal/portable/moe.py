"""Expert dispatch for the torch-tensor backends (`torch`, `cpu`): tokens grouped by expert.

One router matmul, then for each expert that some token chose (in expert order) one gate, one
up and one down matmul over exactly the rows routed to it, with the backend's own matmul, whose
row bits never depend on the row count (compiled kernels by construction, the portable path by
padding). The expert outputs land in one slot per (token, rank):

    slots:  | token 0: rank 0 .. rank k-1 | token 1: rank 0 .. rank k-1 | ...

and each token's output is summed over its slots in rank order, elementwise across tokens. So a
token's bits depend only on its own row: never on which tokens share its batch or chunk.
"""

from __future__ import annotations

import torch

from agentkv.hal.base import Backend, Tensor
from agentkv.hal.blocks import MoEFFN, MoEFFNSpec, shared_expert


def route(
    logits: torch.Tensor, spec: MoEFFNSpec, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits `[n, num_experts]` -> (chosen experts int64 `[n, k]` by falling weight,
    their weights f32 `[n, k]`). Softmax and top-k run per row (torch's last-dim kernels treat
    each row alone); the renormalising sum is written out rank by rank, so it is elementwise.
    Sigmoid scores, a correction `bias` `[num_experts]` and groups: hal/routing.py."""
    from agentkv.hal.routing import plain, route_torch

    if not plain(spec, bias):
        return route_torch(logits, bias, spec)
    k = spec.top_k
    if spec.softmax_after_topk:
        top, chosen = torch.topk(logits, k, dim=-1)
        weights = torch.softmax(top, dim=-1)
    else:
        weights, chosen = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        if spec.norm_topk:
            weights = weights / _rank_sum(weights)
    if spec.weights_scale != 1.0:
        weights = weights * spec.weights_scale
    return chosen, weights


def _rank_sum(w: torch.Tensor) -> torch.Tensor:
    """`w.sum(-1, keepdim=True)` of `[n, k]` in rank order, as k elementwise adds."""
    total = w[:, :1]
    for j in range(1, w.shape[1]):
        total = total + w[:, j : j + 1]
    return total


def grouped_moe(backend: Backend, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec, expert_matmul=None) -> Tensor:
    """`Backend.moe_ffn` for torch tensors: see the module docstring. x `[n, d]` -> `[n, d]`.
    `expert_matmul(rows, weight, tokens)` replaces the experts' `backend.matmul(rows, weight)`
    (hal/lora_moe.py adds the rows' LoRA deltas; `tokens`: the token each row came from)."""
    matmul = expert_matmul or (lambda rows, w, _tokens: backend.matmul(rows, w))
    chosen, probs = route(backend.matmul(x, weights.router).raw, spec, score_bias(weights))
    ex = weights.experts

    def run_expert(e: int, rows: Tensor, tokens: torch.Tensor) -> torch.Tensor:
        hidden = backend.glu([matmul(rows, ex.gate[e], tokens), matmul(rows, ex.up[e], tokens)], spec.act)
        return matmul(hidden, ex.down[e], tokens).raw

    slots_out = expert_slots(x.raw, chosen, spec.num_experts, run_expert)
    return add_shared(backend, x, weights, spec, rank_weighted(slots_out, probs))


def expert_slots(xs: torch.Tensor, chosen: torch.Tensor, num_experts: int, run_expert) -> torch.Tensor:
    """Every (token, rank) slot's expert output `[n * k, d]`: the rows routed to each expert
    that some token chose, in expert order, through `run_expert(e, rows, tokens)` (`tokens`:
    the token each row came from). Reads the experts' counts back to the host."""
    k = chosen.shape[1]
    flat = chosen.reshape(-1)  # slot s = token * k + rank
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    slots_out, start = xs.new_empty((flat.shape[0], xs.shape[1])), 0
    for e, count in enumerate(counts):
        if not count:
            continue
        slots = order[start : start + count]
        start += count
        tokens = slots // k
        slots_out.index_copy_(0, slots, run_expert(e, Tensor(xs.index_select(0, tokens)), tokens))
    return slots_out


def rank_weighted(slots_out: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Each token's slots `[n * k, d]` weighted by `probs` `[n, k]` and summed in rank order,
    elementwise across tokens -> `[n, d]`."""
    n, k = probs.shape
    per_rank = slots_out.view(n, k, -1)
    out = probs[:, :1] * per_rank[:, 0]
    for j in range(1, k):
        out = out + probs[:, j : j + 1] * per_rank[:, j]
    return out


def score_bias(weights: MoEFFN) -> torch.Tensor | None:
    """The layer's choice bias as a flat `[num_experts]` tensor, or None."""
    return None if weights.score_bias is None else weights.score_bias.raw.reshape(-1)


def add_shared(backend: Backend, x: Tensor, weights: MoEFFN, spec: MoEFFNSpec, routed: torch.Tensor) -> Tensor:
    """The routed sum `[n, d]` plus the shared expert's output, scaled by its sigmoid gate."""
    if weights.shared is None:
        return Tensor(routed)
    shared, gate = shared_expert(backend, x, weights.shared, spec.act)
    return Tensor(routed + (shared.raw if gate is None else shared.raw / (1.0 + torch.exp(-gate.raw))))
