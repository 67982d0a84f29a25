"""The promise at its edges, engine side: pins within a budget and never in a request's way,
an engine with nothing to run that does not spin, drafts that never cross namespaces, faults
in the drafter, a disk load and the model run that end only what they touch, and streams that
merge what their reader has not taken."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.errors import StreamStalledError
from agentkv.runtime.outputs import merge_into
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from agentkv.sched.draft import NgramDrafter
from tests.runtime.test_exactness import qwen2_dir, tokens  # noqa: F401

GREEDY8 = SamplingParams(max_tokens=8, temperature=0.0)


def engine_of(model: str, speculative: str | None = None, stream_stall_s: float | None = None, **cache) -> Engine:
    config = EngineConfig(
        model=model,
        cache=CacheConfig(**{"num_blocks": 64, "dtype": "f32", **cache}),
        scheduler=SchedulerConfig(max_num_batched_tokens=256),
        speculative=speculative,
        stream_stall_s=stream_stall_s,
    )
    return Engine(config)


def drain(engine: Engine) -> dict:
    outs: dict = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
        engine.scheduler.check_integrity()
    return outs


def test_pins_stay_within_their_budget_and_a_request_that_fits_the_pool_still_runs(qwen2_dir):  # noqa: F811
    engine = engine_of(qwen2_dir, num_blocks=40, max_pinned_blocks=12, max_pinned_blocks_per_tenant=6)
    prompts = [tokens(40, 100 + i, 256) for i in range(6)]  # 3 blocks each
    tenant_a, tenant_b = ("tenant", "a", None), ("tenant", "b", None)
    for i, p in enumerate(prompts):  # cache each prompt in both tenants' namespaces
        for ns in (tenant_a, tenant_b):
            engine.add_request(f"{ns[1]}-{i}", p, SamplingParams(max_tokens=1, temperature=0.0), namespace=ns)
    drain(engine)
    pinned_a = [engine.pin_prefix(p, tenant_a, ttl_s=3600) for p in prompts]
    assert pinned_a == [40, 40, 0, 0, 0, 0]  # 3 blocks each: a tenant's budget (6) holds two
    pinned_b = [engine.pin_prefix(p, tenant_b, ttl_s=3600) for p in prompts]
    assert pinned_b == [40, 40, 0, 0, 0, 0] and engine.stats().kv_blocks_pinned == 12
    assert engine.pin_prefix(prompts[0], tenant_a, ttl_s=60) == 40  # extending a pin costs nothing
    # A request that needs 32 of the 40 blocks, more than the pins leave, still runs: with
    # nothing else running, the pins holding its blocks are released rather than it waiting.
    big = tokens(440, 7, 256)
    engine.add_request("big", big, SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    out = drain(engine)["big"]
    assert out.finish_reason == "length" and out.num_tokens == 60
    assert engine.cache.num_pins == 0


def test_an_engine_with_nothing_it_can_run_waits_instead_of_spinning(qwen2_dir):  # noqa: F811
    """The loop sleeps while a step runs nothing (here every schedule is empty, as when no
    block can be had); the control with the wait taken out spins on a core."""

    def engine_thread(idle: bool) -> tuple[float, int]:
        """(CPU seconds, steps) of the engine thread over one second."""
        engine = engine_of(qwen2_dir)
        engine.scheduler._start = lambda seq, step: False  # no block can be had
        if not idle:
            engine.idle_wait_s = lambda: 0.0
        steps, step = [0], engine.step

        def counted():
            steps[0] += 1
            return step()

        engine.step = counted
        engine.add_request("stuck", tokens(20, 1, 256), GREEDY8)
        ae = AsyncEngine(engine)
        ae.start()
        time.sleep(0.2)
        native = ae._thread.native_id
        before = next(t for t in psutil.Process().threads() if t.id == native)
        steps_before = steps[0]
        time.sleep(1.0)
        after = next(t for t in psutil.Process().threads() if t.id == native)
        num_steps = steps[0] - steps_before
        asyncio.run(ae.abort("stuck"))
        asyncio.run(ae.shutdown())
        return (after.user_time + after.system_time) - (before.user_time + before.system_time), num_steps

    cpu_s, num_steps = engine_thread(idle=True)
    assert cpu_s < 0.1 and num_steps <= 3
    assert engine_thread(idle=False)[1] > 100  # control: without the wait the thread spins


def test_drafts_come_only_from_the_requests_own_namespace(qwen2_dir):  # noqa: F811
    """Tenant A's finished transcript is what the suffix drafter would copy for B's same prompt;
    B's drafts come from its own history only, so none of A's tokens is proposed to B."""

    def accepted_for_second(first_ns, second_ns) -> int:
        engine = engine_of(qwen2_dir, speculative="suffix")
        prompt = tokens(48, 11, 256)
        params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        engine.add_request("first", prompt, params, namespace=first_ns)
        first = drain(engine)["first"]
        before = engine.counters.spec_accepted_tokens
        engine.add_request("second", prompt, params, namespace=second_ns)
        second = drain(engine)["second"]
        assert second.token_ids == first.token_ids  # drafts never change an answer
        return engine.counters.spec_accepted_tokens - before

    tenant_a, tenant_b = ("tenant", "a", None), ("tenant", "b", None)
    assert accepted_for_second(tenant_a, tenant_a) >= 16  # control: one tenant copies its own history
    assert accepted_for_second(tenant_a, tenant_b) < 4  # B sees only its own context's n-grams


def test_a_failing_drafter_turns_speculation_off_and_every_request_finishes(qwen2_dir, caplog, monkeypatch):  # noqa: F811
    plain = engine_of(qwen2_dir)
    spec = engine_of(qwen2_dir, speculative="ngram")
    prompts = {f"r{i}": tokens(30, 20 + i, 256) for i in range(3)}
    for rid, p in prompts.items():
        plain.add_request(rid, p, GREEDY8)
    want = drain(plain)

    def boom(*args):
        raise RuntimeError("drafter exploded")

    for rid, p in prompts.items():
        spec.add_request(rid, p, GREEDY8)
    first: dict = {}
    for out in spec.step():  # prefill, then the drafter fails at the first decode step
        merge_into(first, out)
    monkeypatch.setattr(NgramDrafter, "propose", boom)
    for rest in drain(spec).values():
        merge_into(first, rest)
    got = first
    assert {r: o.token_ids for r, o in got.items()} == {r: o.token_ids for r, o in want.items()}
    assert all(o.finish_reason == "length" for o in got.values())
    assert not spec.speculation.enabled and "drafter exploded" in caplog.text


def test_a_failing_disk_load_or_model_run_ends_only_the_requests_it_touches(qwen2_dir, tmp_path):  # noqa: F811
    writer = engine_of(qwen2_dir, disk_dir=str(tmp_path))
    cached_prompt = tokens(70, 31, 256)
    writer.add_request("w", cached_prompt, GREEDY8)
    drain(writer)
    writer.close()
    engine = engine_of(qwen2_dir, disk_dir=str(tmp_path))
    engine.add_request("running", tokens(30, 32, 256), SamplingParams(max_tokens=12, temperature=0.0))
    engine.step()  # "running" is decoding now
    real = engine.disk.write_block

    def failing(block, payload):
        raise OSError("disk load failed")

    engine.disk.write_block = failing
    engine.add_request("loaded", cached_prompt, GREEDY8)  # admitted with disk loads
    outs = drain(engine)
    assert outs["loaded"].finish_reason == "error" and "disk load failed" in outs["loaded"].error
    assert outs["running"].finish_reason == "length" and outs["running"].num_tokens == 12
    engine.disk.write_block = real
    engine.add_request("again", cached_prompt, GREEDY8)
    assert drain(engine)["again"].finish_reason == "length"  # the engine went on
    real_run = engine.runner.run
    engine.runner.run = lambda chunks: (_ for _ in ()).throw(RuntimeError("kernel fault"))
    engine.add_request("doomed", tokens(20, 33, 256), GREEDY8)
    assert drain(engine)["doomed"].finish_reason == "error" and engine.stats().step_failures == 2
    engine.runner.run = real_run
    engine.add_request("after", tokens(20, 33, 256), GREEDY8)
    assert drain(engine)["after"].finish_reason == "length"
    engine.close()


def test_an_unread_stream_holds_one_merged_output_and_a_stalled_one_is_ended(qwen2_dir):  # noqa: F811
    engine = engine_of(qwen2_dir)
    ae = AsyncEngine(engine)
    ae.start()
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True, logprobs=1)

    async def unread_then_read():
        stream = ae.generate("slow", tokens(20, 41, 256), params)
        collector = ae._streams["slow"][1]
        await asyncio.sleep(0.05)
        while engine.has_unfinished():
            await asyncio.sleep(0.05)  # the reader takes nothing while the engine decodes
        await asyncio.sleep(0.05)  # the last deliveries land
        return [out async for out in stream], collector

    outs, collector = asyncio.run(unread_then_read())
    assert len(outs) == 1 and outs[0].finished  # 200 steps' outputs merged into one
    assert outs[0].num_tokens == 200 and len(outs[0].token_ids) == 200 and len(outs[0].logprobs) == 200
    assert collector.num_pending_chars == 0
    asyncio.run(ae.shutdown())
    stalled = AsyncEngine(engine_of(qwen2_dir, stream_stall_s=0.05))
    stalled.start()

    async def stop_reading():
        stream = stalled.generate("stall", tokens(20, 42, 256), SamplingParams(max_tokens=400, ignore_eos=True))
        await asyncio.sleep(1.0)
        with pytest.raises(StreamStalledError):
            async for _ in stream:
                pass

    asyncio.run(stop_reading())
    deadline = time.monotonic() + 5
    while stalled.engine.has_unfinished() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stalled.engine.has_unfinished()  # the request was ended, its KV freed
    asyncio.run(stalled.shutdown())
