"""Counts host reads during a piece of work: on a device each is a synchronisation, so the
seventh fence of the host-shape ledger (docs/design.md) says only `read`, `argmax` and
`read_block` may make one. Runs on any tensors (CPU ones too), so the fence is checked where
there is no device: under Triton's interpreter a kernel launch reads its arguments on the
host, which on a device is an asynchronous launch, so reads from inside the interpreter are
not counted."""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

# torch functions that hand a tensor's values to the host (each a sync on a device)
HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__array__", "__bool__", "__int__", "__float__", "__index__"})
FENCES = ("read", "argmax", "read_block")
_TRITON_INTERPRETER = ("triton/runtime/interpreter.py", "triton\\runtime\\interpreter.py")


def _to_host(args, kwargs) -> bool:
    """`Tensor.to(...)` aimed at the CPU."""
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t) == "cpu" for t in targets if isinstance(t, (str, torch.device)))


class HostReads(TorchFunctionMode):
    """`with HostReads(backend) as reads: ...`; then `reads.hidden` lists each host read
    made outside the backend's fences (`"item at agentkv/x.py:12"`), `reads.fenced` counts
    those inside them."""

    def __init__(self, backend):
        super().__init__()
        cls = type(backend)
        self._fence_codes = {getattr(cls, name).__code__ for name in FENCES if hasattr(cls, name)}
        self.hidden: list[str] = []
        self.fenced = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_READS or (name == "to" and _to_host(args, kwargs)):
            self._record(name)
        return func(*args, **kwargs)

    def _record(self, name: str) -> None:
        frame, caller = sys._getframe(2), None
        while frame is not None:
            code = frame.f_code
            if code in self._fence_codes:
                self.fenced += 1
                return
            if code.co_filename.endswith(_TRITON_INTERPRETER):
                return  # a kernel launch: asynchronous on a device
            if caller is None and "/torch/" not in code.co_filename and code.co_filename != __file__:
                caller = f"{code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        self.hidden.append(f"{name} at {caller}")
