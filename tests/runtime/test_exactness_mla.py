"""The exactness contract on a multi-head latent attention model (a tiny random DeepSeek-V3:
low-rank q, latent KV rows, sigmoid routing with groups, shared expert, a leading dense layer):
cache on/off, random warm splits, batch mixes and chunk sizes (`check_contract`), speculation,
and a restart from the disk tier, whose files hold the latent layout's one row per token; the
same on a sparse-attention model (a tiny DeepSeek-V3.2, index keys beside the latent in that
row); and the contract with int8 activations on a quantized file of DeepSeek-V2-Lite's layout
(Q8_0 attention and shared experts, Q4_K / Q5_0 routed experts: the interleaved and super-block
int8 kernels). Every comparison is `np.array_equal`; the control (a row-count-dependent matmul)
is caught by every variant family on both models, so none of the checks passes vacuously."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from agentkv.bench.mla_model import V2LiteShape, synthetic_v2lite
from agentkv.runtime.params import SamplingParams
from tests.models.test_mla_families import VOCAB, built_family
from tests.runtime.test_exactness import (
    VARIANT_FAMILIES,
    SplitKBackend,
    check_contract,
    make_engine,
    rows_equal,
    run,
    tokens,
)
from tests.runtime.test_speculative import make_engine as spec_engine
from tests.runtime.test_speculative import run as spec_plain_run
from tests.runtime.test_speculative import same, spec_run, workload
from tests.runtime.test_warm_restart import BS, GREEDY, transcript
from tests.runtime.test_warm_restart import engine as disk_engine
from tests.runtime.test_warm_restart import run as disk_run


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    return str(built_family("deepseek_v3", tmp_path_factory)[0])  # the oracle test's model


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory):
    return str(built_family("deepseek_v32", tmp_path_factory)[0])


@pytest.fixture(params=["mla", "sparse"])
def latent_dir(request):
    """Each latent-KV model: DeepSeek-V3 (MLA) and DeepSeek-V3.2 (MLA + sparse attention)."""
    return request.getfixturevalue(f"{request.param}_dir")


def test_exact_reuse_sparse_attention(sparse_dir):
    # top-4 keys per query: every row past position 3 attends a chosen subset of its keys
    assert check_contract(sparse_dir, "cpu", VOCAB, 40, seed=6, kv_dtype="f16", light=True) == []


def test_exact_reuse_mla_f16_kv(mla_dir):
    # 270 tokens: rows past one 256-key range, so the range merge runs over latent rows too
    assert check_contract(mla_dir, "cpu", VOCAB, 270, seed=4, kv_dtype="f16", light=True) == []


def test_exact_reuse_mla_reference(mla_dir):
    assert check_contract(mla_dir, "reference", VOCAB, 37, seed=2, light=True) == []


def test_exact_reuse_mla_int8_on_a_quantized_file(tmp_path):
    """int8 activations (interleaved Q8_0 / Q5_0 rows, Q4_K a super-block at a time) keep the
    contract on a latent model; the control: that mode's logits are not the f32 mode's."""
    shape = V2LiteShape(layers=3, d=256, heads=2, kv_rank=64, nope_dim=32, rope_dim=32, v_dim=32, dense_ffn=256,
                        ffn=64, experts=4, top_k=2, shared=1, vocab=VOCAB, context=4096)  # fmt: skip
    path = str(synthetic_v2lite(shape, seed=3, folder=tmp_path))
    prompt = {"p": tokens(20, 2, VOCAB)}
    f32, int8 = (run(make_engine(path, "cpu", activation_dtype=a), prompt)[0]["p"] for a in ("f32", "int8"))
    assert not all(np.array_equal(a, b) for a, b in zip(f32, int8))
    assert check_contract(path, "cpu", VOCAB, 40, seed=5, activation_dtype="int8", light=True) == []


def test_control_non_invariant_backend_is_caught_by_every_variant_family(latent_dir):
    """One variant of each family on the split-K control backend (a row's bits depend on the
    row count): the warm split, the batch and the chunked prefill each break the contract."""
    prompt = tokens(24, 1, VOCAB)
    engine_of = functools.partial(make_engine, latent_dir, SplitKBackend.name)
    cold = run(engine_of(), {"p": prompt})[0]["p"]
    warm_engine = engine_of()
    run(warm_engine, {"prefix": prompt[:17]}, SamplingParams(max_tokens=1, temperature=0.0))
    variants = {
        "warm": run(warm_engine, {"p": prompt})[0]["p"],
        "batched": run(engine_of(), {"o": tokens(11, 2, VOCAB), "p": prompt})[0]["p"],
        "chunk": run(engine_of(chunk=7), {"p": prompt})[0]["p"],
    }
    caught = {family for family, rows in variants.items() if not rows_equal(rows, cold)}
    assert caught == set(VARIANT_FAMILIES), f"unnoticed by {set(VARIANT_FAMILIES) - caught}"


def test_speculation_is_bit_identical(latent_dir):
    requests = workload(VOCAB, GREEDY, batched=True)
    plain = spec_plain_run(spec_engine(latent_dir), requests)
    spec, stats = spec_run(latent_dir, "suffix", requests, plain)
    assert same(spec, plain)
    assert stats.prefix_hit_tokens > 0


def test_restart_from_the_disk_tier_is_exact(latent_dir, tmp_path):
    prompt = transcript(1, 100)
    cold = disk_run(disk_engine(latent_dir, enable_prefix_cache=False), prompt)[1]
    first = disk_engine(latent_dir, tmp_path)
    assert disk_run(first, prompt)[0] == 0
    first.close()
    assert first.disk.stats().written_blocks >= 100 // BS
    second = disk_engine(latent_dir, tmp_path)
    cached, rows = disk_run(second, prompt)
    assert cached == (len(prompt) - 1) // BS * BS and second.disk.stats().hit_blocks == cached // BS
    assert len(rows) == len(cold) and all(np.array_equal(a, b) for a, b in zip(rows, cold))
    second.close()
