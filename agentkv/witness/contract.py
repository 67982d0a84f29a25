"""Watches a backend's ops during a piece of work, for two rows of the host-shape ledger
(docs/design.md): every Tensor an op returns is f32 (`ACTIVATION_TENSOR_DTYPE`), and an op's
Python work does not grow with the rows it is given (`Capabilities.row_loops` names the ops
of a backend that loop per row, as the reference does).

`with OpWatch(backend) as watch: ...` wraps the backend's op methods on that instance only;
`watch.off_dtype` lists `"op -> dtype"` for each result of another type (`watch.checked`
counts the results looked at), and `watch.calls` counts, per op, the Python and C function
calls made inside it and not inside another op it called (`sys.setprofile`; off with
`count_calls=False`, since a profiler slows interpreted kernels a lot).
"""

from __future__ import annotations

import sys
from collections import Counter

from agentkv.hal.base import ACTIVATION_TENSOR_DTYPE, Backend, Tensor

# the methods that are not ops: fences, setup, identity
_NOT_OPS = frozenset(
    {"read", "argmax", "read_block", "write_block", "upload", "upload_weight", "allocate_kv", "set_kv_dtype",
     "set_activation_dtype", "activation_dtypes", "check_kv_spec", "capabilities", "identity", "fingerprint"}
)  # fmt: skip


def op_names(backend: Backend) -> list[str]:
    """The public methods of the Backend contract that compute (everything but _NOT_OPS)."""
    return sorted(
        n for n in dir(Backend) if not n.startswith("_") and n not in _NOT_OPS and callable(getattr(backend, n))
    )


class OpWatch:
    def __init__(self, backend: Backend, count_calls: bool = True):
        self.backend, self.count_calls = backend, count_calls
        self.off_dtype: list[str] = []
        self.checked = 0  # op results whose dtype was looked at
        self.calls: Counter[str] = Counter()
        self._stack: list[str] = []

    def __enter__(self) -> OpWatch:
        for name in op_names(self.backend):
            setattr(self.backend, name, self._wrap(name, getattr(self.backend, name)))
        return self

    def __exit__(self, *exc) -> None:
        for name in op_names(self.backend):
            self.backend.__dict__.pop(name, None)

    def _wrap(self, name: str, method):
        def watched(*args, **kwargs):
            outermost = not self._stack
            self._stack.append(name)
            if outermost and self.count_calls:
                sys.setprofile(self._profile)
            try:
                result = method(*args, **kwargs)
            finally:
                self._stack.pop()
                if outermost and self.count_calls:
                    sys.setprofile(None)
            self._check(name, result)
            return result

        return watched

    def _profile(self, frame, event, arg) -> None:
        if event in ("call", "c_call") and self._stack:
            self.calls[self._stack[-1]] += 1

    def _check(self, name: str, result) -> None:
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, Tensor):
                self.checked += 1
                if t.dtype != ACTIVATION_TENSOR_DTYPE:
                    self.off_dtype.append(f"{name} -> {t.dtype}")


def row_growth(backend: Backend, step, rounds: int = 2) -> dict[str, list[int]]:
    """Calls per op in `step(backend, config)` for the configs "1 row", "7 rows" (one
    sequence's chunk) and "3 seqs" (three decode rows), run once to warm every memo and then
    counted `rounds` times (the fewest calls per op and config: a memo refilled once is not a
    loop): {op: [calls per config]} for the ops that make more calls for 7 rows or 3
    sequences than for 1 row."""
    configs = ("1 row", "7 rows", "3 seqs")
    for config in configs:
        step(backend, config)
    counts: list[Counter[str]] = [Counter() for _ in configs]
    for _ in range(rounds):
        for i, config in enumerate(configs):
            with OpWatch(backend) as watch:
                step(backend, config)
            for op in set(watch.calls) | set(counts[i]):
                seen = counts[i].get(op)
                counts[i][op] = watch.calls[op] if seen is None else min(seen, watch.calls[op])
    ops = set().union(*counts)
    return {op: [c[op] for c in counts] for op in sorted(ops) if max(counts[1][op], counts[2][op]) > counts[0][op]}
