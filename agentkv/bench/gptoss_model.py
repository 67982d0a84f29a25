"""The synthetic GGUF of `agentkv bench gptoss`: gpt-oss-20b's shapes (24 layers, 32 experts,
top-4, width 2880, 64 query / 8 KV heads of 64, a 128-token window on every other layer) with
random weights, written the way llama.cpp's converter writes a gpt-oss file (gguf-py names and
metadata: biases, sinks, MXFP4 experts, f32 norms, biases and router, the other matrices F16),
and a llama-style vocabulary so both engines accept token ids.

About 12 GiB at the full shape: written once into the cache folder (never committed), tensor by
tensor (never held in memory whole) with progress, under a temporary name renamed at the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentkv.bench.common import cache_dir, write_once
from agentkv.bench.moe_model import write_tensor_data, write_vocab

MXFP4 = 39  # gguf.GGMLQuantizationType.MXFP4: 32 E2M1 codes + one E8M0 scale in 17 bytes


@dataclass(frozen=True)
class GptOssShape:
    """gpt-oss-20b's shape by default."""

    layers: int = 24
    d: int = 2880
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 2880  # per expert
    experts: int = 32
    top_k: int = 4
    vocab: int = 201088
    window: int = 128
    context: int = 4096

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"GptOssShape.{name} must be > 0, got {value}")
        if self.d % 32 or self.ffn % 32:
            raise ValueError(f"GptOssShape: d={self.d} and ffn={self.ffn} must divide by 32 (MXFP4 blocks)")
        if self.heads % self.kv_heads or self.top_k > self.experts:
            raise ValueError(f"GptOssShape: heads={self.heads} % kv_heads={self.kv_heads}, top_k <= experts")

    @property
    def tag(self) -> str:
        heads = f"h{self.heads}x{self.kv_heads}"
        return f"L{self.layers}-d{self.d}-{heads}-f{self.ffn}-e{self.experts}k{self.top_k}-v{self.vocab}"


def synthetic_gptoss(shape: GptOssShape, seed: int = 0, folder: Path | None = None) -> Path:
    """The path of the synthetic GGUF of `shape`, written first if it is not cached."""
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"gptoss-synthetic-{shape.tag}-s{seed}.gguf"
    return write_once(path, lambda partial: _write(partial, shape, seed))


def _tensors(shape: GptOssShape):
    """(gguf name, logical dims [rows.., cols], kind) in file order; kind: f32 | f16 | mxfp4."""
    d, f, e, hd = shape.d, shape.ffn, shape.experts, shape.head_dim
    q, kv = shape.heads * hd, shape.kv_heads * hd
    yield "token_embd.weight", (shape.vocab, d), "f16"
    for i in range(shape.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (d,), "f32"
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            yield b + name + ".weight", (rows, d), "f16"
            yield b + name + ".bias", (rows,), "f32"
        yield b + "attn_output.weight", (d, q), "f16"
        yield b + "attn_output.bias", (d,), "f32"
        yield b + "attn_sinks.weight", (shape.heads,), "f32"
        yield b + "post_attention_norm.weight", (d,), "f32"
        yield b + "ffn_gate_inp.weight", (e, d), "f32"
        yield b + "ffn_gate_inp.bias", (e,), "f32"
        for name, dims in (("gate", (e, f, d)), ("up", (e, f, d)), ("down", (e, d, f))):
            yield b + f"ffn_{name}_exps.weight", dims, "mxfp4"
            yield b + f"ffn_{name}_exps.bias", dims[:2], "f32"
    yield "output_norm.weight", (d,), "f32"
    yield "output.weight", (shape.vocab, d), "f16"


def _data(dims: tuple[int, ...], kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random weights: MXFP4 blocks with scales near 2^-6 (values up to ~0.1), f16 at 0.02,
    f32 vectors small (norm gains near 1)."""
    if kind == "mxfp4":
        rows = int(np.prod(dims[:-1]))
        blocks = np.empty((rows, dims[-1] // 32, 17), np.uint8)
        blocks[..., 0] = rng.integers(120, 124, blocks.shape[:2], dtype=np.uint8)  # E8M0 scale bytes
        blocks[..., 1:] = rng.integers(0, 256, (*blocks.shape[:2], 16), dtype=np.uint8)
        return blocks.reshape(*dims[:-1], -1)
    if kind == "f16":
        return (rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)).astype(np.float16)
    return np.float32(1.0) + rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)


def _write(path: Path, shape: GptOssShape, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    _metadata(writer, shape)
    entries = list(_tensors(shape))
    for name, dims, kind in entries:
        if kind == "mxfp4":
            byte_dims = (*dims[:-1], dims[-1] // 32 * 17)
            writer.add_tensor_info(
                name, byte_dims, np.dtype(np.uint8), int(np.prod(byte_dims)), gguf.GGMLQuantizationType.MXFP4
            )
        else:
            dtype = np.dtype(np.float16 if kind == "f16" else np.float32)
            writer.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    write_tensor_data(writer, path, entries, _data, seed, "ffn_down_exps.weight")


def _metadata(writer, shape: GptOssShape) -> None:
    import gguf

    writer.add_name("gpt-oss-synthetic")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_expert_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(150000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(32.0)
    writer.add_rope_scaling_orig_ctx_len(4096)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.top_k)
    writer.add_sliding_window(shape.window)
    writer.add_vocab_size(shape.vocab)
    write_vocab(writer, shape.vocab)
    writer.add_file_type(38)  # MOSTLY_MXFP4 (informational: every tensor carries its own type)
