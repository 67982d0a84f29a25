"""The f16 KV cache on a real engine: the knob reaches the store and halves what a block
costs, f16 changes the logits (so the exactness tests below compare something new),
speculative decoding stays bit-identical to plain decode with f16 KV (and its control still
fails), and the disk tier restores f16 blocks exactly while never serving an f32 file to an
f16 cache or the other way round."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from tests.runtime import test_speculative as spec_tests
from tests.runtime.test_exactness import SplitKBackend, make_engine, qwen2_dir, run, tokens  # noqa: F401
from tests.runtime.test_speculative import GREEDY, SEEDED, oracle, same, spec_run, workload  # noqa: F401
from tests.runtime.test_warm_restart import assert_exact, transcript
from tests.runtime.test_warm_restart import engine as disk_engine
from tests.runtime.test_warm_restart import run as disk_run

SPEC_MAKE_ENGINE = spec_tests.make_engine  # taken before the fixture below replaces it


def test_the_knob_reaches_the_store_and_the_memory_budget(qwen2_dir):  # noqa: F811
    budget = 1 << 20
    engines = {
        dtype: Engine(EngineConfig(model=qwen2_dir, cache=CacheConfig(memory_bytes=budget, dtype=dtype)))
        for dtype in ("f32", "f16")
    }
    kv16 = engines["f16"].runner.kv
    assert kv16.k.dtype == torch.float16 and kv16.v.dtype == torch.float16
    assert engines["f32"].runner.kv.k.dtype == torch.float32
    assert engines["f16"].backend.kv_dtype == "f16"
    per_block = {d: e.model.kv_spec(1, e.block_size).bytes_per_block for d, e in engines.items()}
    assert per_block["f32"] == 2 * per_block["f16"]
    assert engines["f16"].num_blocks == budget // per_block["f16"] == 2 * engines["f32"].num_blocks
    assert engines["f32"].backend.fingerprint != engines["f16"].backend.fingerprint


def test_f16_kv_changes_the_logits_and_reruns_agree(qwen2_dir):  # noqa: F811
    prompt = tokens(300, 8, 256)
    f32 = run(make_engine(qwen2_dir), {"p": prompt})[0]["p"]
    f16 = run(make_engine(qwen2_dir, kv_dtype="f16"), {"p": prompt})[0]["p"]
    again = run(make_engine(qwen2_dir, kv_dtype="f16"), {"p": prompt})[0]["p"]
    assert not any(np.array_equal(a, b) for a, b in zip(f32, f16))
    assert all(np.array_equal(a, b) for a, b in zip(f16, again))


def f16_spec_engine(model, speculative=None, backend="cpu", k=6, prefix_cache=True) -> Engine:
    """test_speculative's engine with the KV cache in f16 (its own make_engine: the fixture below
    replaces that name in its module)."""
    return SPEC_MAKE_ENGINE(model, speculative, backend, k, prefix_cache, kv_dtype="f16")


@pytest.fixture
def f16_engines(monkeypatch):
    monkeypatch.setattr(spec_tests, "make_engine", f16_spec_engine)


@pytest.mark.parametrize("drafter", ["oracle", "suffix"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_speculation_is_bit_identical_with_f16_kv(qwen2_dir, oracle, f16_engines, drafter, params):  # noqa: F811
    requests = workload(256, params, batched=True)
    plain = spec_tests.run(f16_spec_engine(qwen2_dir), requests)
    spec, stats = spec_run(qwen2_dir, drafter, requests, plain)
    assert same(spec, plain)
    assert stats.prefix_hit_tokens > 0 and 0 < stats.spec_accepted_tokens <= stats.spec_drafted_tokens


def test_control_speculation_with_f16_kv_catches_a_row_count_dependent_matmul(qwen2_dir, oracle, f16_engines):  # noqa: F811
    requests = workload(256, GREEDY, batched=False)
    plain = spec_tests.run(f16_spec_engine(qwen2_dir, backend=SplitKBackend.name), requests)
    spec, stats = spec_run(qwen2_dir, "oracle", requests, plain, backend=SplitKBackend.name, k=4)
    assert stats.spec_drafted_tokens > 0
    assert not same(spec, plain)


def test_disk_tier_restores_f16_blocks_exactly(qwen2_dir, tmp_path):  # noqa: F811
    prompt = transcript(21, 200)
    cold = disk_run(disk_engine(qwen2_dir, enable_prefix_cache=False, dtype="f16"), prompt)[1]
    first = disk_engine(qwen2_dir, tmp_path, dtype="f16")
    disk_run(first, prompt)
    first.close()
    files = list(first.disk.tier.dir.glob("g-*/*.kvb"))
    assert len(files) == 199 // 16
    header_bytes = files[0].stat().st_size - first.model.kv_spec(1, 16).bytes_per_block
    assert 0 < header_bytes < 4096  # the payload is the f16 block: half the f32 one
    second = disk_engine(qwen2_dir, tmp_path, dtype="f16")
    cached, rows = disk_run(second, prompt)
    assert cached == 199 // 16 * 16 and second.disk.stats().hit_blocks == 199 // 16
    assert_exact(rows, cold)
    second.close()


def test_an_f32_block_file_never_loads_into_an_f16_cache(qwen2_dir, tmp_path):  # noqa: F811
    prompt = transcript(22, 120)
    first = disk_engine(qwen2_dir, tmp_path, dtype="f32")
    disk_run(first, prompt)
    first.close()
    f16 = disk_engine(qwen2_dir, tmp_path, dtype="f16")
    assert f16.disk.tier.dir != first.disk.tier.dir  # the fingerprint names the directory
    assert disk_run(f16, prompt, "a")[0] == 0 and f16.disk.stats().hit_blocks == 0
    f16.close()
    # An f32 file planted where the f16 cache looks, under the name f16 would give the block:
    key = f16.disk.tier.keys(namespace_text_of(qwen2_dir), prompt, 1)[0]
    f32_file = next(first.disk.tier.dir.glob("g-*/*.kvb"))
    group = f16.disk.tier.group((qwen2_dir, None))
    (f16.disk.tier.dir / f"g-{group[:16]}" / f"{key}.kvb").write_bytes(f32_file.read_bytes())
    again = disk_engine(qwen2_dir, tmp_path, dtype="f16")
    assert disk_run(again, prompt, "b")[0] == 0
    assert again.disk.stats().ignored_files >= 1 and dict(again.disk.stats().ignored)["fingerprint"] >= 1
    again.close()
    control = disk_engine(qwen2_dir, tmp_path, dtype="f32")  # the f32 cache still hits its own files
    assert disk_run(control, prompt, "c")[0] > 0
    control.close()


def namespace_text_of(model: str) -> str:
    from agentkv.cache.disk_format import namespace_text

    return namespace_text((model, None))
