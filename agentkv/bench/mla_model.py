"""The synthetic GGUF of `agentkv bench mla`: DeepSeek-V2-Lite's shapes (27 layers, width 2048,
16 heads, MLA with kv_lora_rank 512 and a 64-dim shared rope key, no q low-rank, 64 routed
experts of 1408 top-6 plus 2 shared, the first layer dense at 10944, vocab 102400, YaRN x40)
with random weights, written the way llama.cpp's converter writes a `deepseek2` file (its
names, including the attn_k_b / attn_v_b split of kv_b, and its metadata).

Types as a Q4_K_M file of this model has them where the rows allow: routed gate/up experts
Q4_K; the down experts (rows of 1408, not a multiple of 256) Q5_0, llama.cpp's own fallback
for Q4_K; every other matrix Q8_0; norms and routers f32. Random blocks with modest scales.
About 9 GiB: written once into the cache folder (never committed), tensor by tensor, under a
temporary name renamed at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentkv.bench.common import cache_dir, write_once
from agentkv.bench.moe_model import write_tensor_data, write_vocab

# qtype -> (weights per block, bytes per block, byte offsets of the f16 scales to set)
BLOCKS = {"Q8_0": (32, 34, (0,)), "Q5_0": (32, 22, (0,)), "Q4_K": (256, 144, (0, 2))}
QTYPE_IDS = {"Q8_0": 8, "Q5_0": 6, "Q4_K": 12}


@dataclass(frozen=True)
class V2LiteShape:
    """DeepSeek-V2-Lite's shape by default."""

    layers: int = 27
    d: int = 2048
    heads: int = 16
    kv_rank: int = 512
    nope_dim: int = 128
    rope_dim: int = 64
    v_dim: int = 128
    dense_ffn: int = 10944
    ffn: int = 1408  # per expert
    experts: int = 64
    top_k: int = 6
    shared: int = 2
    vocab: int = 102400
    context: int = 163840

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"V2LiteShape.{name} must be > 0, got {value}")
        if self.d % 256 or self.ffn % 32 or self.dense_ffn % 32 or self.kv_rank % 32 or self.top_k > self.experts:
            raise ValueError(f"V2LiteShape: d % 256, ffn, dense_ffn, kv_rank % 32 and top_k <= experts: {self}")

    @property
    def tag(self) -> str:
        return f"L{self.layers}-d{self.d}-h{self.heads}-kv{self.kv_rank}-f{self.ffn}-e{self.experts}k{self.top_k}"


def synthetic_v2lite(shape: V2LiteShape, seed: int = 0, folder: Path | None = None) -> Path:
    """The path of the synthetic GGUF of `shape`, written first if it is not cached."""
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"v2lite-synthetic-{shape.tag}-v{shape.vocab}-s{seed}.gguf"
    return write_once(path, lambda partial: _write(partial, shape, seed))


def _tensors(s: V2LiteShape):
    """(gguf name, logical numpy dims [.., rows, cols], kind) in the converter's order; kind:
    f32 or a qtype name."""
    qk = s.nope_dim + s.rope_dim
    yield "token_embd.weight", (s.vocab, s.d), "Q8_0"
    for i in range(s.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.d,), "f32"
        if i == 0:
            for name, dims in (("gate", (s.dense_ffn, s.d)), ("up", (s.dense_ffn, s.d)), ("down", (s.d, s.dense_ffn))):
                yield b + f"ffn_{name}.weight", dims, "Q8_0"
        else:
            yield b + "ffn_gate_inp.weight", (s.experts, s.d), "f32"
            yield b + "ffn_gate_exps.weight", (s.experts, s.ffn, s.d), "Q4_K"
            yield b + "ffn_up_exps.weight", (s.experts, s.ffn, s.d), "Q4_K"
            yield b + "ffn_down_exps.weight", (s.experts, s.d, s.ffn), "Q5_0"
            shared = s.shared * s.ffn
            yield b + "ffn_gate_shexp.weight", (shared, s.d), "Q8_0"
            yield b + "ffn_up_shexp.weight", (shared, s.d), "Q8_0"
            yield b + "ffn_down_shexp.weight", (s.d, shared), "Q8_0"
        yield b + "ffn_norm.weight", (s.d,), "f32"
        yield b + "attn_kv_a_norm.weight", (s.kv_rank,), "f32"
        yield b + "attn_kv_a_mqa.weight", (s.kv_rank + s.rope_dim, s.d), "Q8_0"
        yield b + "attn_k_b.weight", (s.heads, s.kv_rank, s.nope_dim), "Q8_0"
        yield b + "attn_v_b.weight", (s.heads, s.v_dim, s.kv_rank), "Q8_0"
        yield b + "attn_output.weight", (s.d, s.heads * s.v_dim), "Q8_0"
        yield b + "attn_q.weight", (s.heads * qk, s.d), "Q8_0"
    yield "output_norm.weight", (s.d,), "f32"
    yield "output.weight", (s.vocab, s.d), "Q8_0"


def random_tensor(
    dims: tuple[int, ...], kind: str, rng: np.random.Generator, blocks: dict = BLOCKS, scales=(2e-4, 2e-3)
) -> np.ndarray:
    """Random blocks of `kind` (`blocks`: qtype -> weights and bytes per block, the byte
    offsets of its f16 scales) whose scales are drawn from `scales`, or f32 vectors near 1 and
    matrices (routers) near 0.02."""
    if kind == "f32":
        if len(dims) == 1:
            return np.float32(1.0) + rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)
    qk, nbytes, scale_at = blocks[kind]
    rows = int(np.prod(dims[:-1]))
    data = rng.integers(0, 256, (rows * dims[-1] // qk, nbytes), dtype=np.uint8)
    drawn = rng.uniform(*scales, (data.shape[0], len(scale_at))).astype(np.float16).view(np.uint8)
    for j, at in enumerate(scale_at):
        data[:, at : at + 2] = drawn[:, 2 * j : 2 * j + 2]
    return data.reshape(*dims[:-1], dims[-1] // qk * nbytes)


def _write(path: Path, shape: V2LiteShape, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "deepseek2")
    _metadata(writer, shape)
    entries = list(_tensors(shape))
    add_tensor_infos(writer, entries)
    write_tensor_data(writer, path, entries, random_tensor, seed, "attn_q.weight")


def add_tensor_infos(writer, entries: list, blocks: dict = BLOCKS, qtype_ids: dict = QTYPE_IDS) -> None:
    """Each entry's (name, dims, kind) tensor info: f32 for kinds not in `blocks`, else the
    qtype's blocks (`qtype_ids`: kind -> GGML type id)."""
    import gguf

    for name, dims, kind in entries:
        if kind not in blocks:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            qk, nbytes, _ = blocks[kind]
            byte_dims = (*dims[:-1], dims[-1] // qk * nbytes)
            qtype = gguf.GGMLQuantizationType(qtype_ids[kind])
            writer.add_tensor_info(name, byte_dims, np.dtype(np.uint8), int(np.prod(byte_dims)), qtype)


def _metadata(writer, s: V2LiteShape) -> None:
    import gguf

    writer.add_name("deepseek-v2-lite-synthetic")
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.d)
    writer.add_block_count(s.layers)
    writer.add_feed_forward_length(s.dense_ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(1)  # MLA: one latent "head" per token
    writer.add_key_length(s.kv_rank + s.rope_dim)
    writer.add_value_length(s.kv_rank)
    writer.add_key_length_mla(s.nope_dim + s.rope_dim)
    writer.add_value_length_mla(s.v_dim)
    writer.add_kv_lora_rank(s.kv_rank)
    writer.add_rope_dimension_count(s.rope_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(40.0)
    writer.add_rope_scaling_orig_ctx_len(4096)
    writer.add_rope_scaling_yarn_log_mul(0.1 * 0.707)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_leading_dense_block_count(1)
    writer.add_expert_count(s.experts)
    writer.add_expert_used_count(s.top_k)
    writer.add_expert_feed_forward_length(s.ffn)
    writer.add_expert_shared_count(s.shared)
    writer.add_expert_weights_scale(1.0)
    writer.add_vocab_size(s.vocab)
    write_vocab(writer, s.vocab)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M (informational: every tensor carries its own type)
