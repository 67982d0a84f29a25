"""The `torch` backend: portable torch ops with no compiled kernels, on the CPU (`torch`) or
CUDA (`torch-cuda`); the `cpu` backend (hal/cpu) is this class plus the compiled kernels.
The model-facing fused ops (attention_inputs, decoder_block) are the base class's
compositions here; the `cpu` backend replaces them with one compiled call each.

Batch invariance comes from shapes, not luck. MKL's f32 GEMM gives a row the same bits for
any M >= 16, so matmuls pad short batches to 16 rows, and attention runs per 16-position
group with a fixed tile shape (see `attention.py`); elementwise ops avoid torch kernels whose
scalar tail differs from their vector body (silu is written with exp, which has none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from agentkv.hal.base import (
    AttnMeta,
    Backend,
    BackendUnavailable,
    Capabilities,
    KVSpec,
    Layout,
    RopeSpec,
    RopeStyle,
    Tensor,
    Weight,
    check_layout,
)
from agentkv.hal.portable.attention import paged_attention_portable
from agentkv.hal.portable.steps import slots_tensor, to_device
from agentkv.hal.rope import rope_tables

F32 = 0
MIN_ROWS = 16  # MKL sgemm: rows are bit-identical for any M >= 16 (measured on the first development machine)
F32_ONLY = frozenset({Layout.ROW_MAJOR_F32})


KV_TORCH = {"f32": torch.float32, "f16": torch.float16}  # KVSpec.dtype -> element type
KV_LITTLE_ENDIAN = {"f32": "<f4", "f16": "<f2"}  # the disk tier's bytes of one element


class TorchKV:
    """Paged K/V: `k[layer]`, `v[layer]` are `[num_blocks * block_size, kvh, hd]` (slot-major)
    of the spec's dtype (float32 or float16, which ops widen to f32 exactly when they read it).
    `k_blocks[layer]`/`v_blocks[layer]` view the same memory as `[num_blocks, block_size, kvh,
    hd]` for the attention kernel (made once: a view per layer per step is a torch op each)."""

    def __init__(self, spec: KVSpec, device: torch.device):
        shape = (spec.num_layers, spec.num_blocks * spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.spec = spec
        self.k = torch.zeros(shape, dtype=KV_TORCH[spec.dtype], device=device)
        # a latent spec (MLA) stores one vector per token: V is K itself
        self.v = self.k if spec.latent else torch.zeros(shape, dtype=KV_TORCH[spec.dtype], device=device)
        blocks = (spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.k_slots, self.v_slots = self.k.unbind(0), self.v.unbind(0)
        self.k_blocks = tuple(t.view(blocks) for t in self.k_slots)
        self.v_blocks = tuple(t.view(blocks) for t in self.v_slots)
        # layer -> (DecoderLayer, spec, next_norm, compiled block, int8); "stack" -> the whole stack's
        self.decoder_blocks: dict[int | str, tuple] = {}


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * x * x * x)))


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


ACTIVATIONS = {"silu": _silu, "gelu_tanh": _gelu_tanh, "gelu": _gelu_erf}
GLU_KINDS = {"silu": 0, "gelu_tanh": 1}  # the compiled glu kernel's kind codes


class TorchBackend(Backend):
    """Pure torch; weights are dequantized to f32 once, at upload."""

    klass = "approx"

    def __init__(self, device: str = "cpu"):
        self.device = torch.device(device)
        self.name = "torch" if self.device.type == "cpu" else f"torch-{self.device.type}"
        self._rope_memo: dict[RopeSpec, tuple] = {}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            device=str(self.device),
            resident_qtypes=frozenset(),
            asynchronous=self.device.type == "cuda",
            layouts=F32_ONLY,
            row_loops=frozenset({"attention"}),  # one padded 16-row tile loop per sequence
            weights="device" if self.device.type == "cuda" else "copied",
        )

    # -- data in and out ------------------------------------------------------------------
    def upload(self, array: np.ndarray) -> Tensor:
        """A copy: from_numpy alone would alias the caller's array, and in-place ops (the cpu
        backend's add_norm) would then write into host memory the caller still owns."""
        if self.device.type == "cpu":
            return Tensor(torch.from_numpy(np.array(array, dtype=np.float32, order="C")))  # np.array copies
        return Tensor(to_device(np.asarray(array, dtype=np.float32), self.device))

    def upload_weight(self, name, data, qtype, shape, resident=True) -> Weight:
        from agentkv.formats.quants import dequantize

        arr = dequantize(np.asarray(data), qtype).reshape(shape).astype(np.float32)
        return Weight(
            torch.from_numpy(np.ascontiguousarray(arr)).to(self.device), shape, F32, name, layout=Layout.ROW_MAJOR_F32
        )

    def read(self, x: Tensor) -> np.ndarray:
        return x.raw.detach().to("cpu", torch.float32).numpy().copy()

    def argmax(self, x: Tensor) -> np.ndarray:
        return self.read(x).argmax(axis=-1).astype(np.int64)  # numpy: lowest index wins ties

    def reshape(self, x: Tensor, shape) -> Tensor:
        return Tensor(x.raw.reshape(shape))

    def take_rows(self, x: Tensor, rows) -> Tensor:
        return Tensor(x.raw.index_select(0, to_device(np.asarray(rows, dtype=np.int64), self.device)))

    def fuse_rows(self, weights: list[Weight], name: str) -> Weight | None:
        first = weights[0]
        if any(
            w.qtype != first.qtype or w.shape[1:] != first.shape[1:] or w.layout is not first.layout for w in weights
        ):
            return None
        raw = torch.cat([w.raw for w in weights], dim=0)  # stacking rows keeps either layout by row
        return Weight(raw, (sum(w.shape[0] for w in weights), *first.shape[1:]), first.qtype, name, layout=first.layout)

    def split(self, x: Tensor, sizes: list[int]) -> list[Tensor]:
        return [Tensor(part) for part in torch.split(x.raw, sizes, dim=-1)]

    # -- ops ------------------------------------------------------------------------------
    def embedding(self, weight: Weight, ids) -> Tensor:
        check_layout(weight, F32_ONLY, f"{self.name} embedding")
        return Tensor(weight.raw.index_select(0, to_device(np.asarray(ids, dtype=np.int64), self.device)))

    def lora_add(self, x: Tensor, y: Tensor, row_slots: np.ndarray, pieces) -> Tensor:
        """The numpy per-row op on the host (CPU tensors only: their numpy views share memory)."""
        from agentkv.hal.lora import lora_add_rows

        if self.device.type != "cpu":
            raise NotImplementedError(f"{self.name}: lora_add runs on the CPU only, not {self.device}")
        lora_add_rows(x.raw.contiguous().numpy(), y.raw.numpy(), row_slots, pieces, lambda w: w.raw.numpy())
        return y

    def matmul(self, x: Tensor, weight: Weight, bias: Weight | None = None) -> Tensor:
        check_layout(weight, F32_ONLY, f"{self.name} matmul")
        xs = x.raw.contiguous()
        n = xs.shape[0]
        if n < MIN_ROWS and self.device.type == "cpu":
            xs = torch.cat([xs, xs.new_zeros(MIN_ROWS - n, xs.shape[1])])
            out = F.linear(xs, weight.raw)[:n]
        else:
            out = F.linear(xs, weight.raw)
        if bias is not None:
            out = out + bias.raw
        return Tensor(out)

    def rms_norm(self, x: Tensor, weight: Weight, eps: float, unit_offset: bool = False) -> Tensor:
        xs = x.raw
        ms = (xs * xs).mean(dim=-1, keepdim=True)
        gain = (1.0 + weight.raw) if unit_offset else weight.raw
        return Tensor((xs / torch.sqrt(ms + eps)) * gain)

    def layer_norm(self, x: Tensor, weight: Weight, bias: Weight | None, eps: float) -> Tensor:
        xs = x.raw
        centred = xs - xs.mean(dim=-1, keepdim=True)
        var = (centred * centred).mean(dim=-1, keepdim=True)
        out = centred / torch.sqrt(var + eps) * weight.raw
        return Tensor(out + bias.raw if bias is not None else out)

    def rope(self, x: Tensor, positions, spec: RopeSpec) -> Tensor:
        cos, sin = self._rope_rows(positions, spec)
        xs = x.raw
        rot, rest = xs[..., : spec.dim], xs[..., spec.dim :]
        half = spec.dim // 2
        if spec.style is RopeStyle.NEOX:
            a, b = rot[..., :half], rot[..., half:]
            out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        return Tensor(torch.cat([out, rest], dim=-1) if rest.shape[-1] else out)

    def _rope_rows(self, positions, spec: RopeSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin `[n, 1, dim/2]` for these positions; every layer of a step passes the same
        positions array, so the gather is done once per step and spec."""
        memo = self._rope_memo.get(spec)
        if memo is not None and memo[0] is positions:
            return memo[1], memo[2]
        pos = np.asarray(positions, dtype=np.int64)
        cos_t, sin_t = rope_tables(spec, int(pos.max(initial=0)) + 1)
        cos = to_device(cos_t[pos], self.device)[:, None, :]
        sin = to_device(sin_t[pos], self.device)[:, None, :]
        self._rope_memo[spec] = (positions, cos, sin)
        return cos, sin

    def gated_act(self, gate: Tensor, up: Tensor, kind: str) -> Tensor:
        return Tensor(ACTIVATIONS[kind](gate.raw) * up.raw)

    def act(self, x: Tensor, kind: str) -> Tensor:
        return Tensor(ACTIVATIONS[kind](x.raw))

    def moe_ffn(self, x: Tensor, weights, spec) -> Tensor:
        """Tokens grouped by expert, one matmul per active expert (hal/portable/moe.py)."""
        from agentkv.hal.portable.moe import grouped_moe

        return grouped_moe(self, x, weights, spec)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return Tensor(a.raw + b.raw)

    def scale(self, x: Tensor, factor: float) -> Tensor:
        return Tensor(x.raw * factor)

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        return Tensor(torch.tanh(x.raw / cap) * cap)

    # -- KV and attention -----------------------------------------------------------------
    def allocate_kv(self, spec: KVSpec) -> Any:
        return TorchKV(self.check_kv_spec(spec), self.device)

    def kv_store(self, kv: TorchKV, layer: int, k: Tensor, v: Tensor, slot_mapping) -> None:
        slots = slots_tensor(slot_mapping, self.device)
        dtype = kv.k.dtype  # f16: torch's cast, round to nearest even
        kv.k_slots[layer].index_copy_(0, slots, k.raw.to(dtype))
        if not kv.spec.latent:
            kv.v_slots[layer].index_copy_(0, slots, v.raw.to(dtype))

    def copy_blocks(self, kv: TorchKV, pairs) -> None:
        bs = kv.spec.block_size
        for src, dst in pairs:
            kv.k[:, dst * bs : (dst + 1) * bs] = kv.k[:, src * bs : (src + 1) * bs]
            kv.v[:, dst * bs : (dst + 1) * bs] = kv.v[:, src * bs : (src + 1) * bs]

    def read_block(self, kv: TorchKV, block: int) -> bytes:
        bs = kv.spec.block_size
        rows = slice(block * bs, (block + 1) * bs)
        stores = [kv.k[:, rows]] if kv.spec.latent else [kv.k[:, rows], kv.v[:, rows]]
        both = torch.stack(stores, dim=1)  # [layers, 2 (1 latent), bs, kvh, hd]
        return both.cpu().numpy().astype(KV_LITTLE_ENDIAN[kv.spec.dtype], copy=False).tobytes()

    def write_block(self, kv: TorchKV, block: int, data: bytes) -> None:
        s, bs = kv.spec, kv.spec.block_size
        shape = (s.num_layers, s.num_stores, bs, s.num_kv_heads, s.head_dim)
        both = torch.from_numpy(np.frombuffer(data, KV_LITTLE_ENDIAN[s.dtype]).reshape(shape).copy()).to(kv.k.device)
        kv.k[:, block * bs : (block + 1) * bs] = both[:, 0]
        if not s.latent:
            kv.v[:, block * bs : (block + 1) * bs] = both[:, 1]

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
        return Tensor(paged_attention_portable(q.raw, kv, layer, meta, scale, window, softcap))

    def attention_sinks(self, q: Tensor, kv: TorchKV, layer: int, meta: AttnMeta, scale, window, sinks, softcap=None):
        """`attention` with each head's learned logit `sinks` `[h]` (a Weight, or None) in every
        row's softmax denominator (gpt-oss): one more column of the same fixed-shape tile."""
        sink = None if sinks is None else sinks.raw
        return Tensor(paged_attention_portable(q.raw, kv, layer, meta, scale, window, softcap, sink))

    def attention_dense(self, q: Tensor, k: Tensor, v: Tensor, seq_lens, scale: float) -> Tensor:
        out, start = torch.empty_like(q.raw), 0
        h, kvh = q.raw.shape[1], k.raw.shape[1]
        for length in seq_lens:
            sl = slice(start, start + length)
            qs = q.raw[sl].transpose(0, 1)  # [h, L, hd]
            ks = k.raw[sl].transpose(0, 1).repeat_interleave(h // kvh, dim=0)
            vs = v.raw[sl].transpose(0, 1).repeat_interleave(h // kvh, dim=0)
            probs = torch.softmax(torch.matmul(qs, ks.transpose(1, 2)) * scale, dim=-1)
            out[sl] = torch.matmul(probs, vs).transpose(0, 1)
            start += length
        return Tensor(out)


def _stacked(x) -> torch.Tensor:
    """A fused projection's output as it is, or an unfused layer's parts (e.g. q, k, v whose
    weights have different quant types) joined along the last dim: a copy, no arithmetic."""
    if isinstance(x, (list, tuple)):
        return torch.cat([p.raw for p in x], dim=-1)
    return x.raw.contiguous()


def cuda_backend() -> TorchBackend:
    if not torch.cuda.is_available():
        raise BackendUnavailable("backend 'torch-cuda' needs a CUDA device and none is present")
    return TorchBackend("cuda")
