"""GGUFSource against gguf-py's own reader, and every malformed-file case it must name."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from agentkv.formats.errors import FormatError, GGUFError
from agentkv.formats.gguf import GGUFSource
from agentkv.formats.resolve import resolve_model_path
from agentkv.models.bert import BertConfig
from agentkv.models.config import SourceKeys
from agentkv.models.gemma3 import Gemma3Config
from agentkv.models.llama import LlamaConfig

HIDDEN, FFN, VOCAB, LAYERS, HEADS, KV_HEADS = 256, 512, 64, 2, 4, 2
# One tensor per format the brief names; the rest of the model is F32.
LAYER_QTYPES = {
    "attn_q": Q.F16,
    "attn_k": Q.Q8_0,
    "attn_v": Q.Q4_0,
    "attn_output": Q.Q4_1,
    "ffn_gate": Q.Q4_K,
    "ffn_up": Q.Q8_0,
    "ffn_down": Q.F32,
}


def _q4_k_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K blocks whose d/dmin f16 fields are finite (block = 144 bytes per 256)."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    scales = np.full((rows, cols // 256, 2), 0.01, dtype=np.float16).view(np.uint8)
    blocks[:, :, :4] = scales.reshape(rows, cols // 256, 4)
    return blocks.reshape(rows, -1)


def _encode(rng: np.random.Generator, shape: tuple[int, int], qtype: Q) -> np.ndarray:
    if qtype == Q.Q4_K:
        return _q4_k_bytes(rng, *shape)
    values = rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, qtype)


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    skip_keys: tuple[str, ...] = (),
    extra_keys: dict | None = None,
    with_output: bool = True,
) -> Path:
    """A tiny random llama-like model in several quant formats, written by gguf-py."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {
        "context_length": 128,
        "embedding_length": HIDDEN,
        "block_count": LAYERS,
        "feed_forward_length": FFN,
        "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": 50000.0,
        "vocab_size": VOCAB,
        **(extra_keys or {}),
    }
    for key, value in keys.items():
        if key in skip_keys:
            continue
        add = writer.add_float32 if isinstance(value, float) else writer.add_uint32
        add(f"{arch}.{key}", value)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" if i % 7 else f"é{i}" for i in range(VOCAB)])
    writer.add_array("tokenizer.ggml.scores", [float(-i) / 3 for i in range(VOCAB)])
    writer.add_array("tokenizer.ggml.token_type", [i % 4 for i in range(VOCAB)])
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_tensor("token_embd.weight", _encode(rng, (VOCAB, HIDDEN), Q.Q8_0), raw_dtype=Q.Q8_0)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for name, qtype in LAYER_QTYPES.items():
            shape = (HIDDEN, FFN) if name == "ffn_down" else (FFN if "ffn" in name else HIDDEN, HIDDEN)
            data = _encode(rng, shape, qtype)
            writer.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    if with_output:
        writer.add_tensor("output.weight", _encode(rng, (VOCAB, HIDDEN), Q.Q4_0), raw_dtype=Q.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture()
def tiny_gguf(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def test_reads_back_identical_to_gguf_py(tiny_gguf: Path) -> None:
    source = GGUFSource(tiny_gguf)
    oracle = gguf.GGUFReader(tiny_gguf)
    assert source.tensor_names() == [t.name for t in oracle.tensors]
    for t in oracle.tensors:
        info = source.tensor(t.name)
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert info.qtype == int(t.tensor_type)
        assert info.data.dtype == t.data.dtype and info.data.shape == t.data.shape
        assert info.data.tobytes() == t.data.tobytes()
        assert info.num_bytes == t.n_bytes
    assert source.metadata == {k: f.contents() for k, f in oracle.fields.items()}
    assert source.metadata["tokenizer.ggml.tokens"][7] == "é7"
    assert source.metadata["tokenizer.ggml.scores"][3] == -1.0
    assert type(source.metadata["tokenizer.ggml.token_type"][1]) is int
    types = {source.tensor(n).qtype for n in source.tensor_names()}
    assert types == {int(q) for q in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K)}


def test_shapes_are_numpy_order_and_data_is_memmapped(tiny_gguf: Path) -> None:
    source = GGUFSource(tiny_gguf)
    embd = source.tensor("token_embd.weight")
    assert embd.shape == (VOCAB, HIDDEN)
    assert embd.data.shape == (VOCAB, HIDDEN // 32 * 34)  # Q8_0: 34 bytes per 32 values
    assert isinstance(embd.data, np.memmap)
    assert source.tensor("blk.0.attn_q.weight").data.dtype == np.float16
    assert source.tensor("blk.1.ffn_down.weight").shape == (HIDDEN, FFN)
    np.testing.assert_array_equal(source.tensor("blk.0.attn_k.weight").data, gguf.GGUFReader(tiny_gguf).tensors[3].data)


def test_hparams_from_llama_keys(tiny_gguf: Path) -> None:
    hp = GGUFSource(tiny_gguf).hparams
    assert (hp.arch, hp.vocab_size, hp.hidden_size, hp.intermediate_size) == ("llama", VOCAB, HIDDEN, FFN)
    assert (hp.num_layers, hp.num_heads, hp.num_kv_heads, hp.head_dim) == (LAYERS, HEADS, KV_HEADS, 64)
    assert (hp.context_len, hp.rope_theta, hp.tie_embeddings) == (128, 50000.0, False)
    assert hp.norm_eps == pytest.approx(1e-5, rel=1e-6)  # stored as float32
    assert hp.rope_scaling is None
    cfg = LlamaConfig.from_source(GGUFSource(tiny_gguf))
    assert cfg.sliding_window is None and cfg.sliding_window_layers is None


def test_tied_embeddings_when_output_absent(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tied.gguf", with_output=False)
    assert GGUFSource(path).hparams.tie_embeddings is True


def test_mistral_style_sliding_window_covers_every_layer(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "mistral.gguf", extra_keys={"attention.sliding_window": 64})
    cfg = LlamaConfig.from_source(GGUFSource(path))
    assert (cfg.sliding_window, cfg.sliding_window_layers) == (64, (True, True))


def test_gemma3_pattern_local_rope_and_query_scale(tmp_path: Path) -> None:
    path = write_tiny_gguf(
        tmp_path / "g3.gguf",
        arch="gemma3",
        skip_keys=("vocab_size",),
        extra_keys={"block_count": 12, "attention.sliding_window": 512, "attention.key_length": 96},
    )
    with pytest.raises(GGUFError):  # 12 layers declared, tensors for 2: still opens; hparams fine
        GGUFSource(path).tensor("blk.11.attn_q.weight")
    hp, cfg = GGUFSource(path).hparams, Gemma3Config.from_source(GGUFSource(path))
    assert cfg.sliding_window_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert (cfg.rope_theta_local, hp.head_dim, cfg.query_pre_attn_scalar) == (10000.0, 96, 96.0)
    assert hp.vocab_size == VOCAB  # counted from tokenizer.ggml.tokens


def test_real_smollm2_hparams() -> None:
    hp = GGUFSource(resolve_model_path("smollm2")).hparams
    assert (hp.arch, hp.vocab_size, hp.hidden_size, hp.num_layers) == ("llama", 49152, 576, 30)
    assert (hp.num_heads, hp.num_kv_heads, hp.head_dim, hp.context_len) == (9, 3, 64, 8192)
    assert (hp.rope_theta, hp.tie_embeddings) == (100000.0, True)


# ------------------------------------------------------------------ malformed files


def _tensor_field_offsets(path: Path, name: str) -> tuple[int, int]:
    """(offset of the tensor's dims array, offset of its type id) inside the file."""
    reader = gguf.GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]
    field = next(t.field for t in reader.tensors if t.name == name)
    dims, raw_dtype = field.parts[3], field.parts[4]
    return (dims.__array_interface__["data"][0] - base, raw_dtype.__array_interface__["data"][0] - base)


def _patch(path: Path, offset: int, value: np.ndarray) -> None:
    data = bytearray(path.read_bytes())
    data[offset : offset + value.nbytes] = value.tobytes()
    path.write_bytes(bytes(data))


def _raises(path: Path, *needles: str) -> str:
    with pytest.raises(GGUFError) as excinfo:
        GGUFSource(path).hparams
    message = str(excinfo.value)
    assert path.name in message
    for needle in needles:
        assert needle in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    _raises(tmp_path / "absent.gguf", "no such GGUF file")


def test_wrong_magic(tiny_gguf: Path) -> None:
    _patch(tiny_gguf, 0, np.frombuffer(b"GGML", dtype=np.uint8))
    _raises(tiny_gguf, "wrong magic", "b'GGML'")


@pytest.mark.parametrize("keep", [2, 40, 300])
def test_truncated_header(tiny_gguf: Path, keep: int) -> None:
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[:keep])
    _raises(tiny_gguf, "truncated header")


def test_truncated_inside_string_array(tiny_gguf: Path) -> None:
    offset = gguf.GGUFReader(tiny_gguf).fields["tokenizer.ggml.tokens"].offset
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[: offset + 200])
    _raises(tiny_gguf, "truncated header")


def test_truncated_tensor_data_names_the_last_tensor(tiny_gguf: Path) -> None:
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[:-10])
    _raises(tiny_gguf, "truncated file", "'output.weight'")


def test_unknown_quant_type_id(tiny_gguf: Path) -> None:
    _dims, type_offset = _tensor_field_offsets(tiny_gguf, "blk.1.attn_v.weight")
    _patch(tiny_gguf, type_offset, np.array([99], dtype=np.uint32))
    _raises(tiny_gguf, "'blk.1.attn_v.weight'", "unknown quant type id 99")


def test_row_length_not_a_multiple_of_block(tiny_gguf: Path) -> None:
    dims_offset, _ = _tensor_field_offsets(tiny_gguf, "blk.0.attn_k.weight")
    _patch(tiny_gguf, dims_offset, np.array([HIDDEN + 1], dtype=np.uint64))
    _raises(tiny_gguf, "'blk.0.attn_k.weight'", "257", "Q8_0 block size 32")


def test_tensor_bytes_disagree_with_shape(tiny_gguf: Path) -> None:
    dims_offset, _ = _tensor_field_offsets(tiny_gguf, "blk.0.attn_output.weight")
    _patch(tiny_gguf, dims_offset + 8, np.array([HIDDEN * 2], dtype=np.uint64))  # twice the rows
    message = _raises(tiny_gguf, "'blk.0.attn_output.weight'", "Q4_1 [512, 256]")
    assert "starts" in message


def test_missing_required_hparam_key(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "nolayers.gguf", skip_keys=("block_count",))
    _raises(path, "'llama.block_count'")


def test_bad_hparam_value_names_key_and_value(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "zero.gguf", extra_keys={"attention.head_count": 0})
    _raises(path, "llama.attention.head_count", "= 0")


def test_unknown_tensor_name_and_error_hierarchy(tiny_gguf: Path) -> None:
    with pytest.raises(FormatError, match="no tensor named 'nope'"):
        GGUFSource(tiny_gguf).tensor("nope")
    assert issubclass(GGUFError, ValueError)


def test_dequantized_matches_gguf_py(tiny_gguf: Path) -> None:
    source = GGUFSource(tiny_gguf)
    for t in gguf.GGUFReader(tiny_gguf).tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        got = source.dequantized(t.name)
        assert got.shape == source.tensor(t.name).shape
        assert np.array_equal(got.reshape(want.shape), want, equal_nan=True), t.name


def _llama_md(**extra) -> dict:
    base = {
        "general.architecture": "llama",
        "llama.embedding_length": 64,
        "llama.block_count": 2,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4,
        "llama.context_length": 512,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": 32,
    }
    return {**base, **extra}


def test_rope_scaling_keys() -> None:
    from agentkv.formats.hparams import hparams_from_gguf

    md = _llama_md(
        **{
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 128,
        }
    )
    hp = hparams_from_gguf(md, Path("x.gguf"), ["output.weight"])
    assert hp.rope_scaling == {"type": "yarn", "factor": 4.0, "original_context_length": 128}
    assert (hp.num_kv_heads, hp.head_dim, hp.tie_embeddings) == (4, 16, False)
    md["llama.rope.scaling.type"] = "none"
    assert hparams_from_gguf(md, Path("x.gguf"), []).rope_scaling is None


def test_bert_pooling_and_layer_norm_eps() -> None:
    from agentkv.formats.hparams import hparams_from_gguf

    md = {k.replace("llama.", "bert."): v for k, v in _llama_md().items()}
    md.update({"general.architecture": "bert", "bert.pooling_type": 2, "bert.attention.layer_norm_epsilon": 1e-12})
    del md["bert.attention.layer_norm_rms_epsilon"]
    hp = hparams_from_gguf(md, Path("e.gguf"), [])
    pooling = BertConfig.from_keys(SourceKeys(hp, "gguf", "e.gguf")).pooling
    assert (hp.arch, pooling, hp.norm_eps) == ("bert", "cls", 1e-12)
    del md["bert.attention.layer_norm_epsilon"]
    with pytest.raises(GGUFError, match=r"e\.gguf.*'bert\.attention\.layer_norm_rms_epsilon'"):
        hparams_from_gguf(md, Path("e.gguf"), [])
