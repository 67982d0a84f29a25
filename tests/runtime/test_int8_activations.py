"""The int8-activation matmuls in the engine: the knob reaches the kernels, and the exactness
contract holds in that mode (a cache hit, a batch or a chunk never changes a logit bit).

The tiny model is a Q4_1 GGUF (the int8 kernels serve quantized GGUF weights; f32 weights keep
f32 activations), written from a random HF model with a byte-level vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.kernels.loader import _cpu_flags
from agentkv.hal.registry import lookup
from agentkv.runtime.config import EngineConfig
from agentkv.runtime.engine import Engine
from tests.hal.subproc import run_python
from tests.models.helpers import tiny_hf_model, write_gguf
from tests.runtime.test_exactness import check_contract, make_engine, run, tokens


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("q4")
    model = tiny_hf_model(folder / "hf", "qwen2", seed=3, vocab_size=257, max_position_embeddings=512)
    return str(write_gguf(model, folder / "tiny-q4_1.gguf", "qwen2", qtype="Q4_1", byte_vocab=True))


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("q8")
    model = tiny_hf_model(folder / "hf", "qwen2", seed=5, vocab_size=257, max_position_embeddings=512)
    return str(write_gguf(model, folder / "tiny-q8_0.gguf", "qwen2", qtype="Q8_0", byte_vocab=True))


def test_q8_0_is_held_interleaved_under_int8_and_keeps_the_contract(q8_gguf):
    """Under int8 activations the backend holds Q8_0 weights as interleaved copies (qtype 2008;
    Q4_0, Q4_1, Q5_0 and MXFP4 likewise),
    the load log says so, the embedding table reads the same rows, and a cache hit, a batch or
    a chunk still never moves a bit. Control: f32 activations keep the file's Q8_0 mapped."""
    from agentkv.hal.residency import held_bytes
    from agentkv.runtime.loading import weights_summary

    int8, f32 = make_engine(q8_gguf, activation_dtype="int8"), make_engine(q8_gguf)
    held, mapped = int8.model.weight_formats, f32.model.weight_formats
    assert set(held.values()) - {0} == {2008} and set(mapped.values()) - {0} == {8}
    assert "(Q8_0 rows interleaved for the int8 kernels)" in weights_summary(int8.source, int8.model)
    assert "interleaved" not in weights_summary(f32.source, f32.model)
    assert 8 in int8.backend.capabilities.copied_qtypes and not f32.backend.capabilities.copied_qtypes
    # the memory check counts the copies: the int8 backend holds every Q8_0 byte, the f32 one maps them
    copied = sum(int8.source.tensor(n).data.nbytes for n in held if int8.source.tensor(n).qtype == 8)
    assert held_bytes(int8.source, int8.backend, True) - held_bytes(f32.source, f32.backend, True) == copied > 0
    ids = np.arange(0, 257, 7)
    assert int8.model.token_embd.qtype == 2008
    rows = [e.backend.read(e.backend.embedding(e.model.token_embd, ids)) for e in (int8, f32)]
    assert np.array_equal(rows[0], rows[1])
    assert check_contract(q8_gguf, "cpu", 257, 300, seed=6, activation_dtype="int8") == []


def test_the_knob_reaches_the_backend_and_changes_the_logits(q4_gguf):
    """Control: int8 logits are not the f32 ones (the mode is real), yet a rerun repeats them."""
    prompt = tokens(40, 1, 257)
    f32 = run(make_engine(q4_gguf), {"p": prompt})[0]["p"]
    engine = make_engine(q4_gguf, activation_dtype="int8")
    assert engine.backend.activation_dtype == "int8"
    int8 = run(engine, {"p": prompt})[0]["p"]
    again = run(make_engine(q4_gguf, activation_dtype="int8"), {"p": prompt})[0]["p"]
    assert not all(np.array_equal(a, b) for a, b in zip(f32, int8))
    assert all(np.array_equal(a, b) for a, b in zip(int8, again))
    # close to the f32 run all the same: the rounding is per 32-wide block
    cos = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(f32, int8)]
    assert min(cos) > 0.99


def test_exact_reuse_tiny_q4_1_int8(q4_gguf):
    # 300 tokens: rows past one 256-key attention range; chunks of 1, 7 and 64 rows
    assert check_contract(q4_gguf, "cpu", 257, 300, seed=4, activation_dtype="int8") == []


@pytest.mark.slow
def test_exact_reuse_smollm2_int8():
    assert check_contract("smollm2", "cpu", 49152, 40, seed=3, activation_dtype="int8") == []


def test_the_fingerprint_tells_the_modes_apart():
    """Cached KV (the disk tier) is keyed by the fingerprint: int8 blocks never load into f32."""
    assert lookup("cpu").fingerprint != lookup("cpu").set_activation_dtype("int8").fingerprint


def test_bad_activation_dtypes_are_refused_with_their_name():
    with pytest.raises(ValueError, match="activation_dtype='int4'"):
        EngineConfig(model="smollm2", activation_dtype="int4")
    with pytest.raises(ValueError, match="backend 'reference' has no int8 matmul kernels"):
        lookup("reference").set_activation_dtype("int8")
    with pytest.raises(ValueError, match="has no int8"):
        Engine(EngineConfig(model="smollm2", backend="reference", activation_dtype="int8"))


AUTO = """
from agentkv.hal.registry import lookup
print(lookup("cpu", "f32", "auto").activation_dtype, lookup("reference", "f32", "auto").activation_dtype)
"""


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_auto_is_int8_on_either_cpu_build_and_f32_without_int8_kernels(isa):
    """What "auto" (the config's default) picks in a process fixed to `isa`: int8 on the cpu
    backend's AVX-512 and AVX2 builds alike (their one-row int8 decode is the faster on every
    format), f32 on a backend without int8 kernels."""
    flags = _cpu_flags(None) or set()
    if isa == "avx512" and not {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        pytest.skip("this CPU has no AVX-512")
    cpu, reference = run_python(AUTO, AGENTKV_CPU_ISA=isa).stdout.split()
    assert (cpu, reference) == ("int8", "f32")
    assert EngineConfig(model="smollm2").activation_dtype == "auto"


def test_an_engine_on_auto_gives_the_bits_of_the_type_it_chose(q4_gguf):
    """An engine on "auto" (the default) gives the logits of the type "auto" resolved to, and not those of
    the other type (the control: the two differ on this Q4_1 model)."""
    prompt = tokens(24, 2, 257)
    engine = make_engine(q4_gguf, activation_dtype="auto")
    chosen = engine.backend.activation_dtype
    other = {"f32": "int8", "int8": "f32"}[chosen]
    auto = run(engine, {"p": prompt})[0]["p"]
    same = run(make_engine(q4_gguf, activation_dtype=chosen), {"p": prompt})[0]["p"]
    different = run(make_engine(q4_gguf, activation_dtype=other), {"p": prompt})[0]["p"]
    assert all(np.array_equal(a, b) for a, b in zip(auto, same))
    assert not all(np.array_equal(a, b) for a, b in zip(auto, different))
