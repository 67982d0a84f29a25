"""The exactness contract on a tiny random gpt-oss (sinks, a 16-token window on every other
layer, biased experts): cache on/off, warm splits on both sides of window edges, batch mixes,
chunk sizes, f16 KV, speculation and a restart from the disk tier give bit-identical logits
rows, and the control (a sink whose weight depends on the row count) is caught. Rows past one
256-key range, where the sinks join a merge of ranges, are tests/hal/test_attention_sinks.py's."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.base import Tensor
from agentkv.hal.cpu import CpuBackend
from agentkv.hal.registry import register
from tests.models.gpt_oss_tiny import VOCAB, harmony_tokenizer, tiny_gpt_oss, tiny_gpt_oss_mxfp4
from tests.runtime.test_exactness import VARIANT_FAMILIES, check_contract, make_engine, run, tokens


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


def test_exact_reuse_tiny_gpt_oss_mxfp4_int8(tmp_path):
    """MXFP4 experts in the int8-activation mode (qmatmul_vnni.cpp's MXFP4, moe.cpp's int8
    decode loop) keep the contract; the control: that mode's logits are not the f32 mode's."""
    tiny_gpt_oss_mxfp4(tmp_path, vocab_size=VOCAB, seed=3)
    harmony_tokenizer(tmp_path)
    prompt = {"p": tokens(20, 2, 256)}
    f32, int8 = (run(make_engine(str(tmp_path), "cpu", activation_dtype=a), prompt)[0]["p"] for a in ("f32", "int8"))
    assert not all(np.array_equal(a, b) for a, b in zip(f32, int8))
    assert check_contract(str(tmp_path), "cpu", 256, 45, seed=1, activation_dtype="int8", light=True) == []


class RowCountSinkBackend(CpuBackend):
    """The control: the cpu backend with a sink whose weight depends on how many rows share the
    call (one part in 2^20 per row count mod 3), the way a sink folded into per-call partial
    sums would; everything else is the cpu backend's, so only the sink path breaks the contract."""

    name = "cpu-sink-rowcount"

    def attention_sinks(self, q, kv, layer, meta, scale, window, sinks, softcap=None):
        out = super().attention_sinks(q, kv, layer, meta, scale, window, sinks, softcap)
        return Tensor(out.raw * (1.0 + (q.shape[0] % 3) * 2.0**-20))


register(RowCountSinkBackend.name, RowCountSinkBackend, "approx")


def test_control_a_row_count_dependent_sink_is_caught(gpt_oss_dir):
    broken = check_contract(gpt_oss_dir, RowCountSinkBackend.name, 256, 45, seed=1, light=True)
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
