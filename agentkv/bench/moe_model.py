"""The synthetic MoE GGUF of `agentkv bench moe`: OLMoE's layer layout (MHA attention with q/k
RMSNorm over the whole projection, a router, 3-D `ffn_{gate,up,down}_exps`) with random weights,
written the way llama.cpp's converter writes an OLMoE file (gguf-py names and metadata, a small
SentencePiece-style vocabulary so both engines accept token ids), quantized to one qtype.

Built once per shape into a cache folder (never committed): the file name carries the shape,
the qtype and the seed, and a half-written file never takes that name (written, then renamed).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentkv.bench.common import cache_dir

QTYPES = ("Q8_0", "Q4_0")


@dataclass(frozen=True)
class MoEShape:
    """OLMoE-1B-7B's per-layer shape with fewer layers and experts (~1.0B weights by default)."""

    layers: int = 4
    d: int = 2048
    heads: int = 16
    ffn: int = 1024  # per expert
    experts: int = 32
    top_k: int = 8
    vocab: int = 32000
    context: int = 4096

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value <= 0:
                raise ValueError(f"MoEShape.{name} must be > 0, got {value}")
        if self.d % self.heads or self.d % 32 or self.ffn % 32:
            raise ValueError(f"MoEShape: d={self.d} must divide by heads={self.heads} and 32, ffn={self.ffn} by 32")
        if self.top_k > self.experts:
            raise ValueError(f"MoEShape.top_k={self.top_k} exceeds experts={self.experts}")

    @property
    def tag(self) -> str:
        return f"L{self.layers}-d{self.d}-h{self.heads}-f{self.ffn}-e{self.experts}k{self.top_k}-v{self.vocab}"

    def counts(self) -> dict[str, int]:
        """Weights by kind: all of them, the experts', and those one decode token reads."""
        expert = 3 * self.d * self.ffn
        attention = 4 * self.d * self.d + 2 * self.d
        per_layer_dense = attention + self.experts * self.d + 2 * self.d
        embed = self.vocab * self.d
        total = self.layers * (per_layer_dense + self.experts * expert) + 2 * embed + self.d
        active = self.layers * (per_layer_dense + self.top_k * expert) + embed + self.d
        return {"total": total, "experts": self.layers * self.experts * expert, "active_per_token": active}


def synthetic_moe(shape: MoEShape, qtype: str, seed: int = 0, folder: Path | None = None) -> Path:
    """The path of the synthetic GGUF of `shape` in `qtype`, written first if it is not cached."""
    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, got {qtype!r}")
    folder = Path(folder) if folder is not None else cache_dir()
    path = folder / f"olmoe-synthetic-{shape.tag}-{qtype}-s{seed}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    try:
        _write(partial, shape, qtype, seed)
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _write(path: Path, shape: MoEShape, qtype: str, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "olmoe")
    _metadata(writer, shape)
    quant = gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    for name, dims, quantized in _tensors(shape):
        data = (rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02 if quantized else 1.0)).astype(np.float32)
        if not quantized:
            data = np.abs(data)  # norm gains: positive
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tensors(shape: MoEShape):
    """(gguf name, numpy dims [rows.., cols], quantized) of every tensor, in file order."""
    d, f, e = shape.d, shape.ffn, shape.experts
    yield "token_embd.weight", (shape.vocab, d), True
    for i in range(shape.layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (d,), False
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            yield b + proj + ".weight", (d, d), True
        yield b + "attn_q_norm.weight", (d,), False
        yield b + "attn_k_norm.weight", (d,), False
        yield b + "ffn_norm.weight", (d,), False
        yield b + "ffn_gate_inp.weight", (e, d), False
        yield b + "ffn_gate_exps.weight", (e, f, d), True
        yield b + "ffn_up_exps.weight", (e, f, d), True
        yield b + "ffn_down_exps.weight", (e, d, f), True
    yield "output_norm.weight", (d,), False
    yield "output.weight", (shape.vocab, d), True


def _metadata(writer, shape: MoEShape) -> None:
    writer.add_name("olmoe-synthetic")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_expert_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(shape.d // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.top_k)
    writer.add_vocab_size(shape.vocab)
    write_vocab(writer, shape.vocab)
    writer.add_file_type(7)  # MOSTLY_Q8_0 (informational: every tensor carries its own type)


def write_vocab(writer, size: int) -> None:
    """A SentencePiece-style (`llama`) vocabulary of `size` pieces: <unk> <s> </s>, the 256
    byte pieces (only the newline's below 300 pieces, which llama.cpp requires), then filler
    pieces. Enough for token-id prompts on either engine."""
    byte_values = range(256) if size >= 300 else (10,)
    if size < 3 + len(byte_values):
        raise ValueError(f"vocab size must be >= 4, got {size}")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in byte_values]
    fixed = len(tokens)
    tokens += [f"\u2581t{i}" for i in range(size - fixed)]
    types = [2, 3, 3] + [6] * len(byte_values) + [1] * (size - fixed)  # unknown, control, byte, normal
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * fixed + [-float(i) for i in range(size - fixed)])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)


def write_dense_hparams(writer, shape, rope_base: float) -> None:
    """The hyperparameters of a llama-style decoder of `shape` (context, d, layers, ffn, heads,
    kv_heads, head_dim, vocab), with an RMSNorm epsilon of 1e-6."""
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.d)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(shape.vocab)


def write_tensor_data(writer, path: Path, entries: list, data, seed: int, layer_end: str) -> None:
    """After the header, kv and tensor infos: each entry's `data(dims, kind, rng)` in order
    from one seeded generator, logging progress when a tensor named `*layer_end` is done."""
    from agentkv.bench.common import log

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng, written, total = np.random.default_rng(seed), 0, sum(ti.nbytes for ti in writer.tensors[0].values())
    for i, (name, dims, kind) in enumerate(entries):
        block = data(dims, kind, rng)
        writer.write_tensor_data(block)
        written += block.nbytes
        if name.endswith(layer_end) or i == len(entries) - 1:  # once a layer
            log(f"writing {path.name}: {written / 2**30:.2f} of {total / 2**30:.2f} GiB")
    writer.close()
