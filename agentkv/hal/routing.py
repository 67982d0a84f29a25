"""Expert choice beyond a plain softmax top-k: DeepSeek-V2's group-limited softmax, DeepSeek-V3's
and GLM-4.5's sigmoid scores with a correction bias and group-limited top-k.

One token's router logits `[E]` (E experts in G groups of E/G) become its chosen experts and
their weights in four fixed steps, each on that row alone:

    scores  = softmax(logits) | sigmoid(logits)          (what weights the experts)
    choice  = scores + bias                               (bias: e_score_correction_bias, choice only)
    groups  = per group: max(choice) | sum of its top 2   -> keep the `top_groups` best groups
    chosen  = top_k of choice within the kept groups      (falling choice, lowest index on a tie)
    weights = scores[chosen] (/ their sum if norm_topk) * weights_scale

The numpy function is the reference's; the torch one the portable and cpu backends'. Both sort
stably (ties go to the lower index), and the torch one keeps every op per row (sigmoid written
with exp, whose vector body and scalar tail agree; the renormalising sum rank by rank)."""

from __future__ import annotations

from typing import Any

import numpy as np

SCORINGS = ("softmax", "sigmoid")
GROUP_SCORES = ("max", "top2")


def plain(spec: Any, bias: Any) -> bool:
    """True when `spec` routes by the plain softmax top-k (no bias, one group)."""
    return bias is None and spec.scoring == "softmax" and spec.num_groups <= 1


def route_row_np(logits: np.ndarray, bias: np.ndarray | None, spec: Any) -> tuple[np.ndarray, np.ndarray]:
    """One token's logits `[E]` -> (chosen experts `[k]`, their float32 weights `[k]`)."""
    x = logits.astype(np.float32)
    if spec.scoring == "sigmoid":
        scores = np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
    else:
        e = np.exp(x - x.max())
        scores = e / e.sum(dtype=np.float32)
    choice = scores + bias if bias is not None else scores.copy()
    if spec.num_groups > 1:
        grouped = choice.reshape(spec.num_groups, -1)
        if spec.group_score == "max":
            group_scores = grouped.max(axis=-1)
        else:
            top2 = -np.sort(-grouped, axis=-1, kind="stable")[:, :2]
            group_scores = top2[:, 0] + top2[:, 1]
        kept = np.argsort(-group_scores, kind="stable")[: spec.top_groups]
        mask = np.ones(spec.num_groups, bool)
        mask[kept] = False
        grouped = grouped.copy()
        grouped[mask] = -np.inf
        choice = grouped.reshape(-1)
    chosen = np.argsort(-choice, kind="stable")[: spec.top_k]
    weights = scores[chosen]
    if spec.norm_topk:
        total = np.float32(0.0)
        for w in weights:  # rank order, as the torch path sums
            total = np.float32(total + w)
        weights = weights / total
    return chosen, (weights * np.float32(spec.weights_scale)).astype(np.float32)


def route_torch(logits: Any, bias: Any, spec: Any) -> tuple[Any, Any]:
    """Router logits `[n, E]` (torch) -> (chosen int64 `[n, k]`, weights f32 `[n, k]`)."""
    import torch

    if spec.scoring == "sigmoid":
        scores = 1.0 / (1.0 + torch.exp(-logits))
    else:
        scores = torch.softmax(logits, dim=-1)
    choice = scores + bias if bias is not None else scores
    n = logits.shape[0]
    if spec.num_groups > 1:
        grouped = choice.reshape(n, spec.num_groups, -1)
        if spec.group_score == "max":
            group_scores = grouped.max(dim=-1).values
        else:
            top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2]
            group_scores = top2[..., 0] + top2[..., 1]
        order = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices
        dropped = torch.zeros_like(group_scores, dtype=torch.bool)
        dropped.scatter_(1, order[:, spec.top_groups :], True)
        choice = grouped.masked_fill(dropped[..., None], float("-inf")).reshape(n, -1)
    chosen = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, : spec.top_k]
    weights = scores.gather(1, chosen)
    if spec.norm_topk:
        total = weights[:, :1]
        for j in range(1, weights.shape[1]):
            total = total + weights[:, j : j + 1]
        weights = weights / total
    if spec.weights_scale != 1.0:
        weights = weights * spec.weights_scale
    return chosen, weights
