"""Warm restarts from the KV disk tier on a real engine (tiny random qwen2, cpu backend): a
restarted engine serves a transcript from disk with logits bit-identical to an engine with no
cache at all; a kill -9 mid-write, a corrupted file and a changed fingerprint never change an
answer; a working set five times the RAM pool still hits from disk within both budgets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from agentkv.cache.disk_format import namespace_text
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from tests.runtime.test_exactness import qwen2_dir  # noqa: F401  (fixture)

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
BS = 16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def transcript(seed: int, num_tokens: int) -> list[int]:
    """The agent workloads' token generator (docs/design.md, reuse accounting), vocab 256."""
    s, out = 2463534242 + seed, []
    for _ in range(num_tokens):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(s % 256)
    return out


def engine(model: str, disk_dir=None, num_blocks: int = 64, backend: str = "cpu", **cache) -> Engine:
    config = EngineConfig(
        model=model,
        backend=backend,
        cache=CacheConfig(
            block_size=BS,
            num_blocks=num_blocks,
            disk_dir=None if disk_dir is None else str(disk_dir),
            enable_prefix_cache=cache.pop("enable_prefix_cache", True),
            **cache,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=128),
    )
    e = Engine(config)
    e.record_logits = True
    return e


def run(e: Engine, prompt: list[int], rid: str = "r") -> tuple[int, list[np.ndarray]]:
    """(cached_len, the sampled logits rows) of one greedy request run to completion."""
    e.add_request(rid, prompt, GREEDY)
    cached = None
    while e.has_unfinished():
        for out in e.step():
            cached = out.cached_len if out.request_id == rid else cached
    return cached, e.recorded.pop(rid)


def assert_exact(rows, cold_rows) -> None:
    assert len(rows) == len(cold_rows)
    for got, want in zip(rows, cold_rows):
        assert np.array_equal(got, want)


@pytest.fixture(scope="module")
def cold(qwen2_dir):  # noqa: F811
    """Logits rows of an engine with no cache at all, per prompt."""
    e = engine(qwen2_dir, enable_prefix_cache=False)
    memo: dict[tuple[int, ...], list[np.ndarray]] = {}

    def rows(prompt: list[int]) -> list[np.ndarray]:
        key = tuple(prompt)
        if key not in memo:
            memo[key] = run(e, prompt, f"cold{len(memo)}")[1]
        return memo[key]

    return rows


def test_restart_serves_a_transcript_from_disk_exactly(qwen2_dir, cold, tmp_path):  # noqa: F811
    prompt = transcript(1, 300)
    first = engine(qwen2_dir, tmp_path)
    assert run(first, prompt)[0] == 0
    first.close()  # the server's shutdown path: RAM entries are written back, then flushed
    written = first.disk.stats()
    assert written.written_blocks >= 300 // BS and written.dropped_writes == 0
    second = engine(qwen2_dir, tmp_path)
    cached, rows = run(second, prompt)
    assert cached >= 0.9 * len(prompt) and cached == (len(prompt) - 1) // BS * BS
    assert second.disk.stats().hit_blocks == cached // BS
    assert_exact(rows, cold(prompt))
    second.close()


def test_write_through_restart_is_exact_and_a_corrupt_file_is_recomputed(qwen2_dir, cold, tmp_path):  # noqa: F811
    prompt = transcript(2, 200)
    first = engine(qwen2_dir, tmp_path, write_through=True)
    run(first, prompt)
    first.close()
    assert first.disk.stats().written_blocks == 199 // BS
    key = first.disk.tier.keys(namespace_text((qwen2_dir, None)), prompt, 7)[6]
    victim = next(first.disk.tier.dir.glob(f"g-*/{key}.kvb"))
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0x40
    victim.write_bytes(bytes(data))
    second = engine(qwen2_dir, tmp_path)
    cached, rows = run(second, prompt)
    assert cached == 6 * BS  # blocks 0-5 from disk; 6 is bad, so it and the rest are computed
    assert second.disk.stats().ignored_files == 1 and not victim.exists()
    assert_exact(rows, cold(prompt))
    second.close()


def test_another_model_file_reuses_nothing(qwen2_dir, tmp_path_factory, tmp_path):  # noqa: F811
    from tests.models.helpers import tiny_hf_model
    from tests.runtime.test_exactness import byte_level_tokenizer

    prompt = transcript(3, 120)
    first = engine(qwen2_dir, tmp_path)
    run(first, prompt)
    first.close()
    other = tmp_path_factory.mktemp("qwen2-other")
    tiny_hf_model(other, "qwen2", seed=4, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(other)
    second = engine(str(other), tmp_path)
    cached, _ = run(second, prompt)
    assert cached == 0 and second.disk.stats().hit_blocks == 0
    assert second.disk.stats().num_files == 0  # its own directory: the first model's is not listed
    control = engine(qwen2_dir, tmp_path)
    assert run(control, prompt)[0] > 0  # the same model on the same directory does hit


def test_working_set_five_times_the_ram_pool_hits_from_disk(qwen2_dir, cold, tmp_path):  # noqa: F811
    num_blocks = 24  # 384 tokens of RAM
    prompts = [transcript(10 + i, 190) for i in range(10)]  # 10 x 12 full blocks = 5 pools
    block_file = 2 * 2 * BS * 2 * 16 * 4 + 2048  # kv bytes (2 layers, 2 kv heads, hd 16) + header
    disk_bytes = 130 * block_file
    e = engine(qwen2_dir, tmp_path, num_blocks=num_blocks, disk_bytes=disk_bytes)
    for i, p in enumerate(prompts):
        run(e, p, f"a{i}")
    e.disk.tier.flush()
    hits = []
    for i, p in enumerate(prompts):
        cached, rows = run(e, p, f"b{i}")
        hits.append(cached)
        if i in (0, 9):
            assert_exact(rows, cold(p))
        assert e.pool.num_used <= num_blocks
    assert all(c == 176 for c in hits), hits
    stats = e.disk.stats()
    assert stats.hit_blocks >= 10 * 11 - num_blocks and stats.used_bytes <= disk_bytes
    e.close()


WRITER = textwrap.dedent("""
    import sys
    from agentkv.runtime.config import CacheConfig, EngineConfig
    from agentkv.runtime.engine import Engine
    from agentkv.runtime.params import SamplingParams
    from tests.runtime.test_warm_restart import transcript
    e = Engine(EngineConfig(model=sys.argv[1], cache=CacheConfig(
        block_size=16, num_blocks=64, disk_dir=sys.argv[2], write_through=True)))
    print("ready", flush=True)
    for i in range(10_000):
        e.add_request(f"w{i}", transcript(100 + i, 300), SamplingParams(max_tokens=1))
        while e.has_unfinished():
            e.step()
""")


def test_kill_9_during_heavy_writing_then_restart_is_exact(qwen2_dir, cold, tmp_path):  # noqa: F811
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, qwen2_dir, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(tmp_path.glob("kv-v2-*/g-*/*.kvb"))) < 60:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(list(tmp_path.glob("kv-v2-*/g-*/*.kvb"))) >= 60
    e = engine(qwen2_dir, tmp_path)
    for i in (0, 1):  # written before the kill: served from disk, exact
        prompt = transcript(100 + i, 300)
        cached, rows = run(e, prompt, f"k{i}")
        assert cached > 0
        assert_exact(rows, cold(prompt))
    fresh = transcript(7, 100)
    assert_exact(run(e, fresh, "fresh")[1], cold(fresh))
    e.close()
