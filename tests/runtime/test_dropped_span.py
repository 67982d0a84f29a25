"""Dropped spans: a transcript resent with a middle span removed (an agent dropping a stale tool
result) reuses the cached prefix up to the span and recomputes everything after it, so its
logits equal a cold run of the shortened transcript. No KV after the span is ever reused at a
shifted position. From RAM the reuse is token-exact (a hit ending inside a block is copied);
from the disk tier, after a restart, it is the full blocks before the span (the chained keys
of every later block name the dropped tokens).

    original   | kept prefix [0, a) | span [a, b) | rest [b, n) |
    shortened  | kept prefix [0, a) | rest [b, n) |            <- same ids, rest at positions a..
    reused     RAM: a tokens; disk: a // 16 * 16 tokens; computed: the rest
"""

from __future__ import annotations

import pytest

from agentkv.cache.radix import common_prefix_len
from tests.runtime.test_exactness import SplitKBackend, qwen2_dir  # noqa: F401  (fixture)
from tests.runtime.test_warm_restart import BS, assert_exact, cold, engine, run, transcript  # noqa: F401

PROMPT = transcript(41, 260)
SPANS = {  # name: (a, b), the span [a, b) removed
    "inside a block": (37, 53),
    "on block boundaries": (64, 96),
    "near the start": (3, 20),
    "near the end": (243, 251),
}


def shortened(a: int, b: int) -> list[int]:
    return PROMPT[:a] + PROMPT[b:]


def reusable_len(a: int, b: int) -> int:
    """The tokens the shortened transcript shares with the original: exactly `a` for these
    spans (asserted, so a coincidence of the generator cannot stretch the hit)."""
    shared = common_prefix_len(PROMPT, shortened(a, b))
    assert shared == a, f"span {a}:{b} keeps {shared} shared tokens, not {a}; pick another span"
    return a


@pytest.mark.parametrize("span", SPANS.values(), ids=SPANS.keys())
def test_dropped_span_reuses_the_prefix_from_ram_exactly(qwen2_dir, cold, span):  # noqa: F811
    a, b = span
    e = engine(qwen2_dir)
    assert run(e, PROMPT, "full")[0] == 0
    cached, rows = run(e, shortened(a, b), "short")
    assert cached == reusable_len(a, b)
    assert_exact(rows, cold(shortened(a, b)))
    assert e.stats().computed_tokens == len(PROMPT) + 3 + len(shortened(a, b)) - a + 3  # 3 decodes each
    e.scheduler.check_integrity()


@pytest.fixture(scope="module")
def written_dir(qwen2_dir, tmp_path_factory):  # noqa: F811
    """A disk tier holding the original transcript's full blocks, written back at close."""
    folder = tmp_path_factory.mktemp("kv-dropped-span")
    first = engine(qwen2_dir, folder)
    run(first, PROMPT, "full")
    first.close()
    assert first.disk.stats().written_blocks == len(PROMPT) // BS
    return folder


@pytest.mark.parametrize("span", SPANS.values(), ids=SPANS.keys())
def test_dropped_span_after_a_restart_reuses_the_full_blocks_before_it(qwen2_dir, cold, written_dir, span):  # noqa: F811
    a, b = span
    e = engine(qwen2_dir, written_dir)
    cached, rows = run(e, shortened(a, b), "short")
    num_full = reusable_len(a, b) // BS
    assert cached == num_full * BS
    assert e.disk.stats().hit_blocks == num_full and e.disk.stats().loads == (num_full > 0)
    assert_exact(rows, cold(shortened(a, b)))
    e.disk.close()  # read only here: leave the shared directory as the fixture wrote it


def test_control_the_check_catches_a_backend_whose_warm_rows_differ(qwen2_dir):  # noqa: F811
    """The same RAM check on a backend whose matmul bits depend on the batch shape: the warm
    rows of the shortened transcript differ from its cold rows, so `assert_exact` above is
    a test that can fail. Its hit is still the same `a` tokens (the reuse is not what broke)."""
    a, b = SPANS["inside a block"]

    want = run(engine(qwen2_dir, backend=SplitKBackend.name, enable_prefix_cache=False), shortened(a, b), "cold")[1]
    warm = engine(qwen2_dir, backend=SplitKBackend.name)
    run(warm, PROMPT, "full")
    cached, rows = run(warm, shortened(a, b), "short")
    assert cached == a
    with pytest.raises(AssertionError):
        assert_exact(rows, want)


def test_served_dropped_span_is_exact_from_ram_and_after_a_restart(qwen2_dir, tmp_path):  # noqa: F811
    """Over HTTP: `cached_tokens` in usage is the reused prefix, logprobs equal a server with
    no cache at all; first from RAM (token-exact), then from disk after a SIGTERM restart."""
    from tests.runtime.test_warm_restart_serve import Server, completion

    ram_span, disk_span = SPANS["inside a block"], SPANS["near the end"]
    cold_server = Server(qwen2_dir, "--no-prefix-cache")
    try:
        want = {span: completion(cold_server.port, shortened(*span))[1] for span in (ram_span, disk_span)}
    finally:
        cold_server.stop()
    first = Server(qwen2_dir, "--kv-cache-dir", str(tmp_path))
    try:
        assert completion(first.port, PROMPT)[0] == 0
        assert completion(first.port, shortened(*ram_span)) == (reusable_len(*ram_span), want[ram_span])
    finally:
        first.stop()
    second = Server(qwen2_dir, "--kv-cache-dir", str(tmp_path))
    try:
        got = completion(second.port, shortened(*disk_span))
    finally:
        second.stop()
    assert got == (reusable_len(*disk_span) // BS * BS, want[disk_span])
