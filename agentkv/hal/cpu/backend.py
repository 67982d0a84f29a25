"""The `cpu` backend: torch tensors on the CPU and the compiled kernels of `agentkv.hal.kernels`.

Batch invariance comes from the kernels: every matmul and attention row follows one fixed
accumulation order, and so do the fused glue ops (norms, residual adds, gated activations,
rope and the K/V store: fused.cpp), which also spare ~40 small torch ops per layer and step.
The model-facing fused ops (attention_inputs, the decoder block in one call) are in
`block.py`, the routed experts of an MoE layer as one call in `moe.py`; ops without a kernel
are the portable `torch` backend's (hal/portable), whose class this extends. The kernels must
run here: when they cannot (no C++ compiler, a CPU without AVX2/FMA/F16C, a failed build),
constructing the backend raises BackendUnavailable naming why; it never runs the portable path
in their place.
"""

from __future__ import annotations

import ctypes
import mmap
import warnings

import numpy as np
import torch

from agentkv.hal.base import AttnMeta, Capabilities, Identity, Layout, RopeSpec, Tensor, Weight, check_layout
from agentkv.hal.cpu.block import CompiledBlocks
from agentkv.hal.cpu.moe import CompiledExperts
from agentkv.hal.kernels import INTERLEAVED, QTYPE_BLOCK, SUPPORTED_QTYPES, build_id, load
from agentkv.hal.portable.backend import F32, GLU_KINDS, TorchBackend, TorchKV, _stacked
from agentkv.hal.portable.steps import kernel_meta

__all__ = ["F32", "CpuBackend"]

LAYOUTS = frozenset({Layout.ROW_MAJOR_F32, Layout.GGUF_ROWS})
_NO_ROWS = torch.zeros(0, dtype=torch.int64)  # delta_rule's `save` when no state is kept (never written)


def _f32(a: np.ndarray) -> torch.Tensor:
    """A contiguous f32 host array as a tensor sharing its memory (a copy only if it is not one)."""
    return torch.from_numpy(np.ascontiguousarray(a, np.float32))


class CpuBackend(CompiledBlocks, CompiledExperts, TorchBackend):
    """The portable torch backend with its hot ops replaced by the compiled kernels; quantized
    weights stay in the file's blocks (GGUF_ROWS) and the kernels read them as they are."""

    name = "cpu"
    lora_dtypes = ("f32", "f16")  # what lora.cpp reads LoRA A and B^T in (f16: widened exactly)

    def __init__(self):
        super().__init__("cpu")
        self.name = type(self).name
        self._kernels = load()  # raises BackendUnavailable with the cause
        self._rope_full: dict[RopeSpec, tuple] = {}  # spec -> (num_pos, cos, sin) whole tables
        self._lora_lists: dict[int, tuple] = {}  # id(pieces) -> (pieces, lora_add's argument lists)
        self._lora_rows: tuple = (None, None)  # (row_slots, its int32 tensor) of the last call
        self._conv_taps: dict[int, tuple] = {}  # id(conv weight) -> (it, its taps [K, C]) for delta_net_inputs

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            device=str(self.device),
            resident_qtypes=SUPPORTED_QTYPES,
            asynchronous=False,
            fused_attention=True,
            layouts=LAYOUTS,
            weights="mapped",  # the file's blocks are the weights (upload_weight)
            copied_qtypes=frozenset(INTERLEAVED) if self.int8 else frozenset(),
        )

    @property
    def identity(self) -> Identity:
        """Reading it fixes the kernels' ISA (as a kernel call would), so it never goes stale."""
        return Identity(self.name, str(self.device), self._kernels.fix_isa(), build_id())

    def activation_dtypes(self) -> tuple[str, ...]:
        """int8 first ("auto" takes it) on every CPU the kernels run on: they round each row's
        activations to int8 per 32-wide block (256 for the K-quants) for the GGUF formats that
        have a kernel (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4), MoE experts included, and
        take integer dot products: AVX-512 VNNI where the AVX-512 build runs on a CPU with it,
        else AVX2, the same bits either way. Other weights keep f32 activations.

        Why int8 first: the f32 one-row K-quant and MXFP4 matmul is bound by the vector ports,
        not by memory, so f32 decodes the hybrid, MLA and gpt-oss models below llama-server on
        either build (AVX2 forced on a Zen 4: ×0.77, ×0.63, ×0.69), where int8 decodes them at
        ×1.47, ×1.07, ×0.99 and prefills them as fast or faster (×1.05, ×1.08, ×1.41 against
        f32's ×1.09, ×1.06, ×1.21), and SmolLM2 (Q4_1) decodes 1.25x faster with the same 8K
        TTFT; with VNNI int8 decodes 1.1-1.8x faster than f32 and prefills as fast or faster
        (docs/benchmarks.md, "int8 first on every CPU")."""
        return ("int8", "f32")

    @property
    def int8(self) -> bool:
        return self.activation_dtype == "int8"

    def upload_weight(self, name, data, qtype, shape, resident=True) -> Weight:
        if resident and len(shape) == 2 and qtype in SUPPORTED_QTYPES and shape[1] % QTYPE_BLOCK[qtype][0] == 0:
            # The file's own blocks, kept as they are: [out, bytes_per_row] uint8. The
            # memory-mapped file itself is the weight (like llama.cpp's mmap): no copy, so the
            # process holds each weight byte once.
            rows = _mapped_tensor(data, shape[0])
            if qtype in self.capabilities.copied_qtypes:
                # Q4_0, Q4_1, Q5_0, Q8_0, MXFP4 under int8 activations: rows interleaved
                # (kernels.INTERLEAVED: a SIMD lane per 32-wide block, so one float step serves 16
                # blocks; docs/benchmarks.md, "Interleaved 32-wide rows"), a copy of the same
                # size; the file's pages it was read from are handed back.
                interleaved = self._kernels.interleave_rows(rows, qtype, shape[0], shape[1])
                _release_mapped(data)
                return Weight(interleaved, shape, INTERLEAVED[qtype], name, layout=Layout.GGUF_ROWS)
            return Weight(rows, shape, qtype, name, layout=Layout.GGUF_ROWS)
        return super().upload_weight(name, data, qtype, shape, resident)

    # -- ops ------------------------------------------------------------------------------
    def embedding(self, weight: Weight, ids) -> Tensor:
        check_layout(weight, LAYOUTS, "cpu embedding")
        if weight.layout is Layout.ROW_MAJOR_F32:
            return super().embedding(weight, ids)
        idx = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        rows = weight.raw.index_select(0, idx).contiguous()  # raw blocks of the wanted rows
        return Tensor(self._kernels.dequantize(rows, weight.qtype, len(idx), weight.shape[1]))

    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        """Fixed per-element order: invariant at any row count."""
        check_layout(weight, LAYOUTS, "cpu matmul")
        xs = x.raw.contiguous()
        if weight.layout is Layout.GGUF_ROWS:
            out = self._kernels.qmatmul(xs, weight.raw, weight.qtype, weight.shape[0], weight.shape[1], self.int8)
        else:
            out = self._kernels.matmul_f32(xs, weight.raw)
        if bias is not None:
            out = out + bias.raw
        return Tensor(out)

    def matmuls(self, x: Tensor, weights, biases=()) -> list[Tensor]:
        """grouped.cpp's qmatmuls: one kernel call (at decode sizes on AVX-512, one parallel loop
        over every weight's columns, the input rounded once per rounding in int8 mode), each
        output with its own `matmul`'s bits; the default where a weight is of another layout."""
        k = weights[0].shape[1]
        if len(weights) < 2 or any(not _joinable(w, k) for w in weights):
            return super().matmuls(x, weights, biases)
        qtypes = [w.qtype if w.layout is Layout.GGUF_ROWS else 0 for w in weights]
        outs = self._kernels.qmatmuls(
            x.raw.contiguous(), [w.raw for w in weights], qtypes, [w.shape[0] for w in weights], self.int8
        )
        biases = tuple(biases) or (None,) * len(weights)
        return [Tensor(o if b is None else o + b.raw) for o, b in zip(outs, biases)]

    def delta_rule(self, q, k, v, decay, beta, state, rows, inplace=False):
        """recurrent.cpp: per head, column by column in one fixed order (threads split heads),
        where dv is a multiple of 8; else the numpy default. With no state to keep but the last
        (a decode row) the call passes a shared empty `save`."""
        if v.shape[-1] % 8:
            return super().delta_rule(q, k, v, decay, beta, state, rows, inplace)
        last = v.shape[0] - 1
        wanted = [r for r in rows if r != last]
        inplace = inplace and state.flags.c_contiguous and state.flags.writeable and state.dtype == np.float32
        save = torch.from_numpy(np.array(wanted, np.int64)) if wanted else _NO_ROWS
        out, final, kept = self._kernels.gated_delta_rule(
            _f32(q), _f32(k), _f32(v), _f32(decay), _f32(beta), _f32(state), save, inplace
        )
        states = [kept[i].numpy() for i in range(len(wanted))]
        if rows and rows[-1] == last:
            states.append(final.numpy())
        return out.numpy(), states

    def delta_net_inputs(self, window, conv_w, spec):
        """recurrent.cpp, row by row in one fixed order; the numpy default where a head's dims
        are not multiples of 8."""
        if spec.head_k_dim % 8 or spec.head_v_dim % 8:
            return super().delta_net_inputs(window, conv_w, spec)
        q, k, v = self._kernels.delta_net_inputs(_f32(window), self._taps(conv_w), *_delta_shape(spec))
        return q.numpy(), k.numpy(), v.numpy()

    def delta_net_decode(self, rows, weights, spec, states):
        """recurrent.cpp's delta_net_decode: the three kernels' per-row arithmetic in one call and
        one parallel loop over (row, head); the default where a head's dims are not multiples of 8."""
        if spec.head_k_dim % 8 or spec.head_v_dim % 8:
            return super().delta_net_decode(rows, weights, spec, states)
        convs = [torch.from_numpy(c) for c, _ in states]
        recs = [torch.from_numpy(r) for _, r in states]  # written in place: the caller's arrays
        y, after = self._kernels.delta_net_decode(
            *map(_f32, rows), self._taps(weights.conv), _f32(weights.norm), spec.eps, convs, recs, *_delta_shape(spec)
        )
        return y.numpy(), list(after.numpy())

    def _taps(self, conv_w: np.ndarray) -> torch.Tensor:
        """The conv weight `[C, K]` as taps `[K, C]`, made once per weight."""
        taps = self._conv_taps.get(id(conv_w))
        if taps is None or taps[0] is not conv_w:
            taps = self._conv_taps[id(conv_w)] = (conv_w, torch.from_numpy(np.ascontiguousarray(conv_w.T, np.float32)))
        return taps[1]

    def gated_rms_norm(self, out, z, norm, eps):
        """recurrent.cpp; the numpy default where dv is not a multiple of 8."""
        if out.shape[-1] % 8:
            return super().gated_rms_norm(out, z, norm, eps)
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.float32))  # noqa: E731
        return self._kernels.gated_rms_norm(t(out), t(z), t(norm), eps).numpy()

    def head_matmuls(self, xs: list[Tensor], ws) -> list[Tensor] | None:
        """`xs[i] @ ws[i]` in one kernel call (grouped.cpp), each with one matmul's bits; None
        (one matmul per head) unless every weight is f32 rows of one shape with k % 32 == 0."""
        first = ws[0]
        if first.shape[1] % 32 or any(w.layout is not Layout.ROW_MAJOR_F32 or w.shape != first.shape for w in ws):
            return None
        outs = self._kernels.head_matmuls([x.raw.contiguous() for x in xs], [w.raw for w in ws])
        return [Tensor(o) for o in outs]

    def lora_add(self, x: Tensor, y: Tensor, row_slots: np.ndarray, pieces) -> Tensor:
        """lora.cpp: a fixed per-row order (32-lane shrink, ascending-rank expand). The kernel's
        argument lists are kept per pieces tuple (a decode step reuses its predecessor's)."""
        ys = y.raw if y.raw.is_contiguous() else y.raw.contiguous()
        lists = self._lora_lists.get(id(pieces))
        if lists is None or lists[0] is not pieces:
            if len(self._lora_lists) > 4096:
                self._lora_lists.clear()
            columns = [[p.a.raw for p in pieces], [p.bt.raw for p in pieces]]
            columns += [[p.slot for p in pieces], [p.scale for p in pieces], [p.col for p in pieces]]
            lists = self._lora_lists[id(pieces)] = (pieces, columns)
        if self._lora_rows[0] is not row_slots:
            self._lora_rows = (row_slots, torch.from_numpy(np.ascontiguousarray(row_slots, dtype=np.int32)))
        self._kernels.lora_add(x.raw.contiguous(), ys, self._lora_rows[1], *lists[1])
        return Tensor(ys)

    def rms_norm(self, x: Tensor, weight: Weight, eps: float, unit_offset: bool = False) -> Tensor:
        return Tensor(self._kernels.rms_norm(x.raw.contiguous(), weight.raw, eps, unit_offset))

    # -- fused glue: one compiled kernel each (fused.cpp) --------------------------------
    def add_norm(
        self,
        h: Tensor,
        delta: Tensor,
        weight: Weight,
        eps: float,
        unit_offset: bool = False,
        post_weight: Weight | None = None,
    ) -> tuple[Tensor, Tensor]:
        """h_new is h's own storage updated in place (see Backend.add_norm)."""
        hs = h.raw.contiguous()
        post = post_weight.raw if post_weight is not None else None
        normed = self._kernels.add_norm(hs, delta.raw.contiguous(), weight.raw, post, eps, unit_offset)
        return Tensor(hs), Tensor(normed)

    def glu(self, x, kind: str) -> Tensor:
        if kind not in GLU_KINDS:
            return super().glu(x, kind)
        return Tensor(self._kernels.glu(_stacked(x), GLU_KINDS[kind]))

    def attention(
        self,
        q: Tensor,
        kv: TorchKV,
        layer: int,
        meta: AttnMeta,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        return Tensor(_kernel_attention(self._kernels, q.raw, (kv, layer), meta, scale, window, softcap))

    def sparse_latent_attention(self, q_abs, q_index, head_w, kv: TorchKV, layer, meta, spec, ispec):
        """sparse_mla.cpp: each row's index scores, top-k keys and latent attention in one fixed
        order, rows split across threads (hal/mla_sparse.py)."""
        tables, row_seq, row_pos = kernel_meta(meta)
        t = lambda x: x.raw.contiguous()  # noqa: E731
        out = self._kernels.sparse_latent_attention(
            t(q_abs), t(q_index), t(head_w), kv.k_blocks[layer], tables, row_seq, row_pos,
            spec.kv_rank, ispec.top_k, float(spec.scale), float(ispec.head_dim**-0.5),
        )  # fmt: skip
        return out.numpy()

    def attention_sinks(self, q: Tensor, kv: TorchKV, layer: int, meta: AttnMeta, scale, window, sinks, softcap=None):
        """`attention` with each head's learned logit `sinks` `[h]` (a Weight, or None) joining
        the merged ranges as one last term (attention_ranges.cpp: `finish`)."""
        sink = None if sinks is None else sinks.raw
        return Tensor(_kernel_attention(self._kernels, q.raw, (kv, layer), meta, scale, window, softcap, sink))


def _release_mapped(data) -> None:
    """Drop the pages of `data` from this process when it is a read-only file mapping (gguf-py's
    and the safetensors reader's np.memmap, mode "r"): its bytes now live in a copy, and the
    file's pages would otherwise stay counted in the process's resident memory. Pages the range
    shares with a neighbour at either end are kept; anything else (an array in memory) is left
    alone, since MADV_DONTNEED would zero private memory."""
    base = data
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    if not (isinstance(base, np.memmap) and base.mode == "r"):
        return
    array, page = np.asarray(data), mmap.PAGESIZE
    address = array.ctypes.data
    start, end = -(-address // page) * page, (address + array.nbytes) // page * page
    if end > start:
        _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


_LIBC = ctypes.CDLL(None, use_errno=True)


def _mapped_tensor(data: np.ndarray, rows: int) -> torch.Tensor:
    """A uint8 `[rows, bytes_per_row]` view of (read-only, memory-mapped) file data. torch
    warns that it cannot protect read-only memory; weights are never written, so the
    warning is silenced here and nowhere else."""
    arr = np.asarray(data)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    arr = arr.view(np.uint8)  # f16 / bf16 (uint16) element data: its bytes, never its values cast
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr.reshape(rows, -1))


def _kernel_attention(mod, q, kv_layer: tuple[TorchKV, int], meta: AttnMeta, scale, window, softcap, sinks=None):
    """The compiled kernel walks each row's keys 0..pos in order: invariant by construction."""
    tables, row_seq, row_pos = kernel_meta(meta)
    kv, layer = kv_layer
    return mod.paged_attention(
        q.contiguous(),
        kv.k_blocks[layer],
        kv.v_blocks[layer],
        tables,
        row_seq,
        row_pos,
        float(scale),
        int(window or 0),
        float(softcap or 0.0),
        sinks,
    )


def _delta_shape(spec) -> tuple:
    """A DeltaNetSpec's head counts and dims as the recurrent kernels take them."""
    return spec.num_k_heads, spec.head_k_dim, spec.num_v_heads, spec.head_v_dim, spec.tiled


def _joinable(w: Weight, k: int) -> bool:
    """A weight `qmatmuls` takes: GGUF rows, or f32 rows (qtype 0) with k a multiple of 32."""
    if w.shape[1] != k:
        return False
    return w.layout is Layout.GGUF_ROWS or (w.layout is Layout.ROW_MAJOR_F32 and k % 32 == 0)
