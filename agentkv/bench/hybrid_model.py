"""The synthetic GGUF of `agentkv bench hybrid`: Qwen3.5-0.8B's text shapes (24 layers, three
gated DeltaNet layers to each gated full-attention layer, width 1024, DeltaNet 16 key and 16
value heads of 128 with a 4-tap conv, attention 8 query / 2 KV heads of 256 with a quarter of
each head rotated, dense FFN 3584, vocab 248320, the head tied to the embedding) with random
weights, written the way llama.cpp's converter writes a `qwen35` file (its names, its
metadata, its value-head order: random weights have no order to keep).

Types as a Q4_K_M file of this model has them where the rows allow: the large matrices Q4_K,
the FFN down projections and the tied embedding Q6_K, the DeltaNet's small parameters (conv,
decay, dt bias, the b/a projections) and every norm f32. Scales are small enough that the
residual stream stays finite through the layers, and the decay is negative (-exp(A_log)), so
the recurrent state stays bounded. About 0.6 GiB: written once into the cache folder (never
committed), under a temporary name renamed at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentkv.bench.common import cache_dir, write_once
from agentkv.bench.mla_model import add_tensor_infos, random_tensor
from agentkv.bench.moe_model import write_dense_hparams, write_tensor_data, write_vocab

# qtype -> (weights per block, bytes per block, byte offsets of the f16 scales to set)
BLOCKS = {"Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,))}
QTYPE_IDS = {"Q4_K": 12, "Q6_K": 14}


@dataclass(frozen=True)
class Qwen35Shape:
    """Qwen3.5-0.8B's text model by default."""

    layers: int = 24
    d: int = 1024
    ffn: int = 3584
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 256
    rope_dim: int = 64
    linear_k_heads: int = 16
    linear_v_heads: int = 16
    linear_dim: int = 128
    conv_kernel: int = 4
    interval: int = 4  # every interval-th layer is full attention
    vocab: int = 248320
    context: int = 262144

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"Qwen35Shape.{name} must be > 0, got {value}")
        if self.d % 256 or self.ffn % 256 or self.linear_dim % 32 or self.linear_v_heads % self.linear_k_heads:
            raise ValueError(f"Qwen35Shape: d and ffn % 256, linear_dim % 32, v heads a multiple of k heads: {self}")

    @property
    def top_k(self) -> int:
        return 0  # dense: no experts (decode_bytes reads every tensor)

    @property
    def tag(self) -> str:
        linear = f"dn{self.linear_k_heads}x{self.linear_v_heads}"
        return f"L{self.layers}-d{self.d}-f{self.ffn}-h{self.heads}x{self.kv_heads}-{linear}"


def synthetic_qwen35(shape: Qwen35Shape, seed: int = 0, folder: Path | None = None) -> Path:
    """The path of the synthetic GGUF of `shape`, written first if it is not cached."""
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"qwen35-synthetic-{shape.tag}-v{shape.vocab}-s{seed}.gguf"
    return write_once(path, lambda partial: _write(partial, shape, seed))


def _tensors(s: Qwen35Shape):
    """(gguf name, logical numpy dims [.., rows, cols], kind) in the converter's order; kind:
    f32, a_log (the negative decay), or a qtype name."""
    key, value = s.linear_k_heads * s.linear_dim, s.linear_v_heads * s.linear_dim
    yield "token_embd.weight", (s.vocab, s.d), "Q6_K"
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.d,), "f32"
        if (i + 1) % s.interval:
            yield b + "ssm_a", (s.linear_v_heads,), "a_log"
            yield b + "ssm_conv1d.weight", (2 * key + value, s.conv_kernel), "f32"
            yield b + "ssm_dt.bias", (s.linear_v_heads,), "f32"
            yield b + "ssm_alpha.weight", (s.linear_v_heads, s.d), "f32"
            yield b + "ssm_beta.weight", (s.linear_v_heads, s.d), "f32"
            yield b + "attn_qkv.weight", (2 * key + value, s.d), "Q4_K"
            yield b + "attn_gate.weight", (value, s.d), "Q4_K"
            yield b + "ssm_norm.weight", (s.linear_dim,), "f32"
            yield b + "ssm_out.weight", (s.d, value), "Q4_K"
        yield b + "ffn_down.weight", (s.d, s.ffn), "Q6_K"
        yield b + "ffn_gate.weight", (s.ffn, s.d), "Q4_K"
        yield b + "ffn_up.weight", (s.ffn, s.d), "Q4_K"
        yield b + "post_attention_norm.weight", (s.d,), "f32"
        if not (i + 1) % s.interval:
            yield b + "attn_k_norm.weight", (s.head_dim,), "f32"
            yield b + "attn_k.weight", (s.kv_heads * s.head_dim, s.d), "Q4_K"
            yield b + "attn_output.weight", (s.d, s.heads * s.head_dim), "Q4_K"
            yield b + "attn_q_norm.weight", (s.head_dim,), "f32"
            yield b + "attn_q.weight", (2 * s.heads * s.head_dim, s.d), "Q4_K"  # query | gate per head
            yield b + "attn_v.weight", (s.kv_heads * s.head_dim, s.d), "Q6_K"
    yield "output_norm.weight", (s.d,), "f32"


def _data(dims: tuple[int, ...], kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `kind` with small f16 scales (weights of a few hundredths at most),
    f32 gains near 1 and matrices near 0.02, or the decay -exp(A_log) in [-8, -0.5]."""
    if kind == "a_log":
        return -rng.uniform(0.5, 8.0, dims).astype(np.float32)
    return random_tensor(dims, kind, rng, BLOCKS, (2e-6, 2e-5))


def _write(path: Path, shape: Qwen35Shape, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen35")
    _metadata(writer, shape)
    entries = list(_tensors(shape))
    _add_infos(writer, entries)
    write_tensor_data(writer, path, entries, _data, seed, "post_attention_norm.weight")


def _add_infos(writer, entries: list) -> None:
    add_tensor_infos(writer, entries, BLOCKS, QTYPE_IDS)  # f32 and a_log: plain f32


def _metadata(writer, s: Qwen35Shape) -> None:
    arch = "qwen35"
    writer.add_name("qwen3.5-0.8b-synthetic")
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.d)
    writer.add_block_count(s.layers)
    writer.add_feed_forward_length(s.ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_rope_dimension_count(s.rope_dim)
    pairs = s.rope_dim // 2  # text positions: every section is the token's position
    writer.add_array(f"{arch}.rope.dimension_sections", [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", s.conv_kernel)
    writer.add_uint32(f"{arch}.ssm.state_size", s.linear_dim)
    writer.add_uint32(f"{arch}.ssm.group_count", s.linear_k_heads)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", s.linear_v_heads)
    writer.add_uint32(f"{arch}.ssm.inner_size", s.linear_v_heads * s.linear_dim)
    writer.add_uint32(f"{arch}.full_attention_interval", s.interval)
    writer.add_vocab_size(s.vocab)
    write_vocab(writer, s.vocab)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M (informational: every tensor carries its own type)


@dataclass(frozen=True)
class Qwen3Shape:
    """Qwen3-0.6B's shapes by default: the dense model of a size like Qwen3.5-0.8B's that the
    agent replay runs next to the hybrid (28 layers, width 1024, 16 query / 8 KV heads of 128
    with q/k norms, FFN 3072, vocab 151936, the head tied to the embedding)."""

    layers: int = 28
    d: int = 1024
    ffn: int = 3072
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151936
    context: int = 40960

    @property
    def tag(self) -> str:
        return f"L{self.layers}-d{self.d}-f{self.ffn}-h{self.heads}x{self.kv_heads}"


def synthetic_qwen3(shape: Qwen3Shape, seed: int = 0, folder: Path | None = None) -> Path:
    """The path of the synthetic dense GGUF of `shape` (types and scales as `synthetic_qwen35`)."""
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"qwen3-synthetic-{shape.tag}-v{shape.vocab}-s{seed}.gguf"
    return write_once(path, lambda partial: _write_dense(partial, shape, seed))


def _dense_tensors(s: Qwen3Shape):
    yield "token_embd.weight", (s.vocab, s.d), "Q6_K"
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.d,), "f32"
        yield b + "attn_q.weight", (s.heads * s.head_dim, s.d), "Q4_K"
        yield b + "attn_k.weight", (s.kv_heads * s.head_dim, s.d), "Q4_K"
        yield b + "attn_v.weight", (s.kv_heads * s.head_dim, s.d), "Q6_K"
        yield b + "attn_output.weight", (s.d, s.heads * s.head_dim), "Q4_K"
        yield b + "attn_q_norm.weight", (s.head_dim,), "f32"
        yield b + "attn_k_norm.weight", (s.head_dim,), "f32"
        yield b + "ffn_norm.weight", (s.d,), "f32"
        yield b + "ffn_gate.weight", (s.ffn, s.d), "Q4_K"
        yield b + "ffn_up.weight", (s.ffn, s.d), "Q4_K"
        yield b + "ffn_down.weight", (s.d, s.ffn), "Q6_K"
    yield "output_norm.weight", (s.d,), "f32"


def _write_dense(path: Path, shape: Qwen3Shape, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_name("qwen3-0.6b-synthetic")
    write_dense_hparams(writer, shape, 1_000_000.0)
    write_vocab(writer, shape.vocab)
    writer.add_file_type(15)
    entries = list(_dense_tensors(shape))
    _add_infos(writer, entries)
    write_tensor_data(writer, path, entries, _data, seed, "ffn_down.weight")
