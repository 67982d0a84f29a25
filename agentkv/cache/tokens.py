"""Comparing token runs at C speed: the radix tree and the scheduler match long prompts."""

from __future__ import annotations

from collections.abc import Sequence

COMPARE_SLICE = 256  # tokens compared at once, in C, by common_prefix_len


def common_prefix_len(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b[start:]`: slices compared as tuples, then
    token by token only inside the one that differs (no Python work per matched token)."""
    limit = max(min(len(a), len(b) - start), 0)
    for i in range(0, limit, COMPARE_SLICE):
        j = min(i + COMPARE_SLICE, limit)
        if tuple(a[i:j]) != tuple(b[start + i : start + j]):
            return next(k for k in range(i, j) if a[k] != b[start + k])
    return limit
