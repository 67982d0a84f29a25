"""The `cuda` backend: the portable torch backend's glue with Triton kernels for everything
whose bits torch would let depend on the row count on a GPU (GEMMs, reductions, attention).

    matmul (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, I4G32, I8G32, F8G32 weights, read from their
        gguf blocks): `matmul_kernel`, fixed BM x BN x BK tiles, K summed from 0 in BK steps
    embedding of quantized rows: `embedding_kernel`, elementwise dequantization
    rms_norm (and the q/k norms built on it): `rms_norm_kernel`, a program per row
    add_norm (residual add, optional post norm, next norm): `add_norm_kernel`, one launch
    attention (prefill and decode, windows, softcap, sinks, f16 KV): `attention_kernel`, a
        program per (row, head), 256-key ranges merged in ascending order, then the sink
    rope, glu, gated_act, add, scale, kv_store: torch elementwise, one IEEE op per element

Per-step index tensors reach the device through pinned, non-blocking copies (`to_device`),
and nothing reads the device but `read`, `argmax` and `read_block`: the seventh fence.

    moe_ffn: the routed rows sorted by expert on the device and one `grouped_matmul_kernel`
        launch per projection (hal/cuda/moe.py): no host read of the counts

`layer_norm` and `attention_dense` (encoders, not cached) stay the portable torch versions.
"""

from __future__ import annotations

import numpy as np
import torch

from agentkv.hal.base import AttnMeta, Capabilities, Layout, Tensor, Weight, check_layout
from agentkv.hal.cuda import launch
from agentkv.hal.cuda.dequant import BLOCKS
from agentkv.hal.identity import Identity
from agentkv.hal.portable.backend import TorchBackend, TorchKV
from agentkv.hal.portable.steps import to_device

LAYOUTS = frozenset({Layout.ROW_MAJOR_F32, Layout.GGUF_ROWS})


class CudaBackend(TorchBackend):
    """Triton kernels on CUDA tensors, or on CPU tensors under Triton's interpreter
    (`interpreter=True`: the same kernels, run by `TRITON_INTERPRET=1`, for CI)."""

    def __init__(self, device: str, interpreter: bool, isa: str):
        super().__init__(device)
        self.name = "cuda"
        self.interpreter, self._isa = interpreter, isa
        self.tiles = launch.INTERPRETER_TILES if interpreter else launch.DEVICE_TILES

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            device=str(self.device),
            resident_qtypes=frozenset(BLOCKS),
            asynchronous=not self.interpreter,
            fused_attention=True,
            layouts=LAYOUTS,
            weights="copied" if self.interpreter else "device",
        )

    @property
    def identity(self) -> Identity:
        return Identity(self.name, str(self.device), self._isa, launch.build_id(self.tiles))

    def upload_weight(self, name, data, qtype, shape, resident=True) -> Weight:
        """A 2-D weight of a format in BLOCKS stays as its gguf rows (uint8 `[rows, row_bytes]`
        on the device); anything else is dequantized to f32 once, as the portable backend does."""
        if not (resident and qtype in BLOCKS and len(shape) == 2):
            return super().upload_weight(name, data, qtype, shape, resident)
        rows, cols = shape
        per_block, nbytes = BLOCKS[qtype]
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
        if cols % per_block or raw.shape[1] != cols // per_block * nbytes:
            raise ValueError(
                f"weight {name!r}: qtype {qtype} rows of {cols} need {cols // per_block * nbytes} bytes "
                f"({per_block} weights per {nbytes}-byte block), got {raw.shape[1]}"
            )
        return Weight(torch.from_numpy(raw.copy()).to(self.device), shape, qtype, name, layout=Layout.GGUF_ROWS)

    def argmax(self, x: Tensor) -> np.ndarray:
        """Fence: the per-row argmax on the device (torch returns the first maximal index),
        then only the ids cross to the host."""
        return x.raw.argmax(dim=-1).to("cpu", torch.int64).numpy().copy()

    def embedding(self, weight: Weight, ids) -> Tensor:
        if weight.layout is Layout.ROW_MAJOR_F32:
            return super().embedding(weight, ids)
        ids = to_device(np.asarray(ids, dtype=np.int64), self.device)
        return Tensor(launch.embedding(self.tiles, weight, ids))

    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        check_layout(weight, LAYOUTS, "cuda matmul")
        return Tensor(launch.matmul(self.tiles, x.raw, weight, None if bias is None else bias.raw))

    def rms_norm(self, x: Tensor, weight: Weight, eps: float, unit_offset: bool = False) -> Tensor:
        return Tensor(launch.rms_norm(self.tiles, x.raw, weight.raw, eps, unit_offset))

    def add_norm(self, h, delta, weight, eps, unit_offset=False, post_weight=None) -> tuple[Tensor, Tensor]:
        post = None if post_weight is None else post_weight.raw
        h_new, normed = launch.add_norm(self.tiles, h.raw, delta.raw, weight.raw, eps, unit_offset, post)
        return Tensor(h_new), Tensor(normed)

    def moe_ffn(self, x: Tensor, weights, spec) -> Tensor:
        from agentkv.hal.cuda.moe import moe_ffn

        return moe_ffn(self, x, weights, spec)

    def biased_moe_ffn(self, x: Tensor, weights, spec) -> Tensor:
        from agentkv.hal.cuda.moe import biased_moe_ffn

        return biased_moe_ffn(self, x, weights, spec)

    def attention(self, q: Tensor, kv: TorchKV, layer: int, meta: AttnMeta, scale, window=None, softcap=None) -> Tensor:
        tables = launch.step_tables(meta, self.device)
        return Tensor(launch.attention(self.tiles, q.raw, kv, layer, tables, launch.Scores(scale, window, softcap)))

    def attention_sinks(self, q: Tensor, kv: TorchKV, layer: int, meta: AttnMeta, scale, window, sinks, softcap=None):
        """`attention` with each head's learned logit `sinks` `[h]` (a Weight, or None) in every
        row's softmax denominator, added after the last 256-key range (gpt-oss)."""
        tables = launch.step_tables(meta, self.device)
        sink = None if sinks is None else sinks.raw.to(torch.float32).contiguous()
        scores = launch.Scores(scale, window, softcap, sink)
        return Tensor(launch.attention(self.tiles, q.raw, kv, layer, tables, scores))


__all__ = ["CudaBackend"]
