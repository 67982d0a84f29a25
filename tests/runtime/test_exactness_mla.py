"""The exactness contract on a multi-head latent attention model (a tiny random DeepSeek-V3:
low-rank q, latent KV rows, sigmoid routing with groups, shared expert, a leading dense layer):
cache on/off, random warm splits, batch mixes and chunk sizes (`check_contract`), speculation,
and a restart from the disk tier, whose files hold the latent layout's one row per token; and
the contract on a sparse-attention model (a tiny DeepSeek-V3.2, index keys beside the latent).
Every comparison is `np.array_equal`; the control (a row-count-dependent matmul) is caught by
every variant family, so none of the checks passes vacuously on this model."""

from __future__ import annotations

import functools

import numpy as np
import pytest

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


def test_exact_reuse_sparse_attention(sparse_dir):
    # top-4 keys per query: every row past position 3 attends a chosen subset of its keys
    assert check_contract(sparse_dir, "cpu", VOCAB, 40, seed=6, kv_dtype="f16", light=True) == []


def test_exact_reuse_mla_f16_kv(mla_dir):
    # 270 tokens: rows past one 256-key range, so the range merge runs over latent rows too
    assert check_contract(mla_dir, "cpu", VOCAB, 270, seed=4, kv_dtype="f16", light=True) == []


def test_exact_reuse_mla_reference(mla_dir):
    assert check_contract(mla_dir, "reference", VOCAB, 37, seed=2, light=True) == []


def test_control_non_invariant_backend_is_caught_by_every_variant_family(mla_dir):
    """One variant of each family on the split-K control backend (a row's bits depend on the
    row count): the warm split, the batch and the chunked prefill each break the contract."""
    prompt = tokens(24, 1, VOCAB)
    engine_of = functools.partial(make_engine, mla_dir, SplitKBackend.name)
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


def test_speculation_is_bit_identical(mla_dir):
    requests = workload(VOCAB, GREEDY, batched=True)
    plain = spec_plain_run(spec_engine(mla_dir), requests)
    spec, stats = spec_run(mla_dir, "suffix", requests, plain)
    assert same(spec, plain)
    assert stats.prefix_hit_tokens > 0


def test_restart_from_the_disk_tier_is_exact(mla_dir, tmp_path):
    prompt = transcript(1, 100)
    cold = disk_run(disk_engine(mla_dir, enable_prefix_cache=False), prompt)[1]
    first = disk_engine(mla_dir, tmp_path)
    assert disk_run(first, prompt)[0] == 0
    first.close()
    assert first.disk.stats().written_blocks >= 100 // BS
    second = disk_engine(mla_dir, tmp_path)
    cached, rows = disk_run(second, prompt)
    assert cached == (len(prompt) - 1) // BS * BS and second.disk.stats().hit_blocks == cached // BS
    assert len(rows) == len(cold) and all(np.array_equal(a, b) for a, b in zip(rows, cold))
    second.close()
