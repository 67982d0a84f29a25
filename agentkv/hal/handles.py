"""The handles of the compute contract (re-exported by `hal.base`): activations, weights,
what a backend can do, and the error of a backend that cannot run here."""

from __future__ import annotations

from typing import Any, NamedTuple

from agentkv.hal.layout import Layout, LayoutError

# Every activation between ops is f32 (the matmuls may round their input to int8 inside;
# KV stores hold KV_DTYPES): a backend that hands another type from an op breaks the contract.
ACTIVATION_TENSOR_DTYPE = "float32"
# How a backend holds weights: "mapped" keeps the file's pages (the OS may drop and re-read
# them), "copied" holds them in host memory, "device" in the accelerator's memory.
WEIGHT_RESIDENCY = ("mapped", "copied", "device")


class Tensor:
    """An opaque handle to a backend-owned activation. `raw` belongs to the backend alone."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any):
        self.raw = raw

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.raw.shape)

    @property
    def dtype(self) -> str:
        """The element type behind the handle ("float32", ...): between ops it is always
        ACTIVATION_TENSOR_DTYPE (agentkv/witness/contract.py watches every op's results)."""
        return str(self.raw.dtype).removeprefix("torch.")

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape})"


class BackendUnavailable(RuntimeError):
    """A registered backend that cannot run here; the message names the cause (no device, a
    missing dependency or compiler, a CPU feature, a failed kernel build)."""


class Weight:
    """A resident weight: the backend's own format (f32, or quantized blocks kept as such).

    `shape` is the logical numpy-order shape (`[out, in]` for a linear weight); `qtype`
    is the gguf quant type the resident data is in (F32 after dequantization); `layout`
    says how `raw` holds it (F32 is ROW_MAJOR_F32, a quant type GGUF_ROWS)."""

    __slots__ = ("raw", "shape", "qtype", "name", "layout")

    def __init__(self, raw: Any, shape: tuple[int, ...], qtype: int, name: str = "", *, layout: Layout):
        self.raw, self.shape, self.qtype, self.name = raw, tuple(shape), int(qtype), name
        self.layout = Layout(layout)
        if (self.layout is Layout.ROW_MAJOR_F32) != (self.qtype == 0):
            raise LayoutError(f"weight {name!r}: layout {self.layout.value!r} cannot hold qtype {self.qtype}")

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, shape={self.shape}, qtype={self.qtype}, layout={self.layout.value!r})"


class Capabilities(NamedTuple):
    device: str  # "cpu", "cuda:0", ...
    resident_qtypes: frozenset[int]  # gguf quant types kept quantized in memory
    asynchronous: bool = False  # ops may return before the work is done
    fused_attention: bool = False
    layouts: frozenset[Layout] = frozenset({Layout.ROW_MAJOR_F32})  # weight layouts the ops read
    # ops whose Python work grows with the rows or sequences of a call (the reference loops
    # per row; a fast backend declares none, and witness/contract.py counts to hold it to that)
    row_loops: frozenset[str] = frozenset()
    # where `upload_weight` puts a weight (WEIGHT_RESIDENCY): every weight is uploaded at load
    # and stays; the loader refuses a model whose resident bytes exceed the memory that holds them
    weights: str = "copied"
    # file qtypes a "mapped" backend still holds as a copy of its own (the cpu backend's
    # interleaved rows under int8 activations), counted against memory before load
    copied_qtypes: frozenset[int] = frozenset()
