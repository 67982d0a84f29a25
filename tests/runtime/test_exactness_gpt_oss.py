"""The exactness contract on a tiny random gpt-oss (sinks, a 16-token window on every other
layer, biased experts): cache on/off, warm splits on both sides of window edges, batch mixes,
chunk sizes, f16 KV, speculation and a restart from the disk tier give bit-identical logits
rows, and the control (a matmul whose bits depend on the row count) is caught."""

from __future__ import annotations

import pytest

from tests.models.gpt_oss_tiny import VOCAB, harmony_tokenizer, tiny_gpt_oss
from tests.runtime.test_exactness import VARIANT_FAMILIES, SplitKBackend, check_contract


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss")
    tiny_gpt_oss(folder, vocab_size=VOCAB, seed=3)
    harmony_tokenizer(folder)
    return str(folder)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_exact_reuse_tiny_gpt_oss(gpt_oss_dir, kv_dtype):
    # 45 tokens: splits at 1, 16, 17, 44 and one random, on both sides of the window's edge
    assert check_contract(gpt_oss_dir, "cpu", 256, 45, seed=1, kv_dtype=kv_dtype, light=kv_dtype == "f16") == []


def test_exact_reuse_tiny_gpt_oss_long_rows(gpt_oss_dir):
    # 300 tokens: full-attention rows past one 256-key range, so the sinks join a merge of ranges
    assert check_contract(gpt_oss_dir, "cpu", 256, 300, seed=4, light=True) == []


def test_control_non_invariant_backend_is_caught(gpt_oss_dir):
    broken = check_contract(gpt_oss_dir, SplitKBackend.name, 256, 45, seed=1, light=True)
    caught = {name.split()[0].split("=")[0] for name in broken}
    assert caught == set(VARIANT_FAMILIES), f"unnoticed: {set(VARIANT_FAMILIES) - caught} (broken: {broken})"


def test_speculation_is_bit_identical(gpt_oss_dir, monkeypatch):
    from tests.runtime import test_speculative as spec

    monkeypatch.setitem(spec.DRAFTERS, "oracle", spec.OracleDrafter)
    monkeypatch.setattr(spec.OracleDrafter, "truth", {})
    requests = spec.workload(256, spec.GREEDY, batched=True)
    plain = spec.run(spec.make_engine(gpt_oss_dir), requests)
    got, stats = spec.spec_run(gpt_oss_dir, "oracle", requests, plain)
    assert spec.same(got, plain)
    assert 0 < stats.spec_accepted_tokens < stats.spec_drafted_tokens


def test_restart_from_the_disk_tier_is_bit_identical(gpt_oss_dir, tmp_path):
    from tests.runtime import test_warm_restart as wr

    prompt = wr.transcript(5, 70)
    _, cold = wr.run(wr.engine(gpt_oss_dir, enable_prefix_cache=False), prompt)
    first = wr.engine(gpt_oss_dir, tmp_path, write_through=True)
    wr.run(first, prompt)
    first.close()
    cached, rows = wr.run(wr.engine(gpt_oss_dir, tmp_path), prompt)
    assert cached >= 64  # four 16-token blocks from disk
    wr.assert_exact(rows, cold)
