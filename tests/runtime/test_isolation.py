"""A failing request fails alone: bad rows, dead-end grammars, requests too big for the pool,
embedding models asked to generate, unsafe parameters; the rest of the batch gets exactly
the tokens it would have had alone, and the engine's state stays consistent."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.cache import radix, radix_check
from agentkv.hal.cpu import CpuBackend
from agentkv.hal.registry import register
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.errors import KVCapacityError, NotAGeneratorError, PromptTooLongError
from agentkv.runtime.llm import LLM
from agentkv.runtime.outputs import merge_into
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.sampler import SamplingState, process_logits, sample
from tests.runtime.test_exactness import make_engine, qwen2_dir, run, tokens  # noqa: F401

GREEDY8 = SamplingParams(max_tokens=8, temperature=0.0)
HEALTHY = {"ok1": tokens(20, 5, 256), "ok2": tokens(27, 8, 256)}


class PoisonedCpu(CpuBackend):
    """The cpu backend, except that logits read-back number `poison_read` (1-based) gets
    NaN in row 0: a stand-in for a model bug hitting one request's row."""

    name = "cpu-poisoned"
    poison_read: int | None = None

    def read(self, x):
        out = super().read(x)
        self.num_reads = getattr(self, "num_reads", 0) + 1
        if self.num_reads == self.poison_read:
            out[0] = np.nan
        return out


register(PoisonedCpu.name, PoisonedCpu, "approx")


class DeadEndConstraint:
    """A grammar that allows any token twice, then none: an all-False mask mid-output."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.num_accepted = vocab_size, 0

    def allowed_mask(self):
        return np.full(self.vocab_size, self.num_accepted < 2)

    def accept(self, token_id: int) -> None:
        self.num_accepted += 1

    def is_finished(self) -> bool:
        return False


@pytest.fixture(scope="module")
def alone(qwen2_dir):  # noqa: F811
    """Each healthy prompt run alone: the tokens it must get in any batch."""
    engine = make_engine(qwen2_dir)
    return {rid: run(engine, {rid: ids}, GREEDY8)[1][rid].token_ids for rid, ids in HEALTHY.items()}


def drain(engine: Engine) -> dict:
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
        engine.scheduler.check_integrity()
    return outs


def add_bad_then_healthy(engine: Engine, constraint=None) -> None:
    # The bad request arrives first, so its row is row 0 of every step it runs in.
    engine.add_request("bad", tokens(25, 6, 256), GREEDY8, constraint=constraint)
    for rid, ids in HEALTHY.items():
        engine.add_request(rid, ids, GREEDY8)


def assert_healthy_exact(outs: dict, alone: dict) -> None:
    for rid, expected in alone.items():
        assert outs[rid].error is None and outs[rid].finish_reason == "length"
        assert outs[rid].token_ids == expected


def assert_consistent_and_alive(engine: Engine, alone: dict) -> None:
    engine.scheduler.check_integrity()
    assert engine.scheduler.num_running == engine.scheduler.num_waiting == 0
    after = run(engine, {"again": HEALTHY["ok1"]}, GREEDY8)[1]["again"]
    assert after.token_ids == alone["ok1"] and after.error is None
    engine.free_cache()
    assert engine.pool.num_free == engine.num_blocks


@pytest.mark.parametrize("poison_read", [1, 3])  # in the prefill step; mid-decode
def test_nan_row_fails_that_request_alone(qwen2_dir, alone, poison_read):  # noqa: F811
    engine = make_engine(qwen2_dir, backend="cpu-poisoned")
    engine.backend.poison_read = poison_read
    add_bad_then_healthy(engine)
    outs = drain(engine)
    bad = outs["bad"]
    assert bad.finished and bad.finish_reason == "error" and "NaN" in bad.error
    assert len(bad.token_ids) == poison_read - 1  # the tokens sampled before the bad row
    assert_healthy_exact(outs, alone)
    assert_consistent_and_alive(engine, alone)


def test_poisoned_backend_control(qwen2_dir, alone):  # noqa: F811
    """Control: with no poisoned read the same batch has no failure, so the test above sees
    the poison and not some other difference of the backend."""
    engine = make_engine(qwen2_dir, backend="cpu-poisoned")
    add_bad_then_healthy(engine)
    outs = drain(engine)
    assert outs["bad"].error is None and len(outs["bad"].token_ids) == 8
    assert_healthy_exact(outs, alone)


def test_all_forbidding_mask_fails_that_request_alone(qwen2_dir, alone):  # noqa: F811
    engine = make_engine(qwen2_dir)
    add_bad_then_healthy(engine, DeadEndConstraint(engine.vocab_size))
    outs = drain(engine)
    bad = outs["bad"]
    assert bad.finish_reason == "error" and "every token is masked" in bad.error
    assert len(bad.token_ids) == 2
    assert_healthy_exact(outs, alone)
    assert_consistent_and_alive(engine, alone)


def test_request_bigger_than_the_pool_is_refused_and_the_next_one_runs(qwen2_dir, alone):  # noqa: F811
    engine = make_engine(qwen2_dir, num_blocks=8)  # 8 x 16 = 128 tokens, context 512
    with pytest.raises(KVCapacityError, match=r"needs 27 KV blocks.* 8 blocks.*--kv-cache-blocks"):
        engine.add_request("big", tokens(20, 1, 256), SamplingParams(max_tokens=400))
    with pytest.raises(KVCapacityError):
        engine.validate(tokens(20, 1, 256), SamplingParams(max_tokens=400))
    assert not engine.has_unfinished() and engine.abort("big") is None
    engine.add_request("big", HEALTHY["ok1"], GREEDY8)  # the id is free again
    assert drain(engine)["big"].token_ids == alone["ok1"]
    engine.scheduler.check_integrity()


def test_explicit_max_model_len_bigger_than_the_pool_fails_at_start(qwen2_dir):  # noqa: F811
    config = EngineConfig(model=qwen2_dir, max_model_len=512, cache=CacheConfig(num_blocks=8))
    with pytest.raises(ValueError, match=r"8 blocks x 16 = 128 tokens.*\(512 tokens\).*--kv-cache-blocks"):
        Engine(config)
    Engine(EngineConfig(model=qwen2_dir, max_model_len=128, cache=CacheConfig(num_blocks=8)))


def test_failure_inside_add_request_leaves_nothing_registered(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir)
    with pytest.raises(PromptTooLongError):
        engine.add_request("x", [5] * 600, GREEDY8)
    engine.add_request("x", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))
    assert set(engine._requests) == {"x"} and engine.scheduler.num_waiting == 1


def test_embedding_model_does_not_generate():
    message = "minilm is an embedding model; it does not generate"
    llm = LLM("minilm")
    with pytest.raises(NotAGeneratorError, match=message):
        llm.generate(["hello"])
    with pytest.raises(NotAGeneratorError, match=message):
        llm.engine.add_request("a", [101, 102], GREEDY8)
    assert not llm.engine.has_unfinished() and llm.engine.step() == []


def test_cli_generate_with_an_embedding_model_exits_2(capsys):
    from agentkv.cli import main

    assert main(["generate", "minilm", "x"]) == 2
    assert "minilm is an embedding model; it does not generate" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, value",
    [
        ("repetition_penalty", 1e-40),
        ("repetition_penalty", 1e-4),
        ("repetition_penalty", 1e4),
        ("temperature", 1e6),
    ],
)
def test_unsafe_sampling_values_are_refused(name, value):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{name: value})
    assert name in str(info.value) and repr(value) in str(info.value)


def test_sampler_keeps_finite_logits_finite():
    big = np.float32(np.finfo(np.float32).max) / 2
    logits = np.array([big, -big, 1.0, -np.inf], np.float32)
    params = SamplingParams(repetition_penalty=1e-3, temperature=0.5, seed=1)
    state = SamplingState.create(params, [0, 1, 3])
    processed = process_logits(logits, params, state)
    assert np.isfinite(processed[:3]).all() and processed[3] == -np.inf
    assert processed[0] > processed[2] > processed[1]  # the order among seen tokens stays
    assert sample(logits, params, state).token_id == 0


def test_llm_generate_collects_only_its_own_requests(qwen2_dir, alone):  # noqa: F811
    llm = LLM(qwen2_dir, kv_cache_blocks=256)
    llm.engine.add_request("other", HEALTHY["ok2"], SamplingParams(max_tokens=2, temperature=0.0))
    outs = llm.generate([HEALTHY["ok1"]], GREEDY8)
    assert [o.token_ids for o in outs] == [alone["ok1"]]
    with pytest.raises(PromptTooLongError):
        llm.generate([HEALTHY["ok1"], [5] * 600], GREEDY8)
    assert not llm.engine.has_unfinished()  # the first prompt of the refused call is gone too
    assert [o.token_ids for o in llm.generate([HEALTHY["ok1"]], GREEDY8)] == [alone["ok1"]]


def test_stats_is_a_snapshot_that_never_walks_the_tree_when_read(qwen2_dir, monkeypatch):  # noqa: F811
    engine = make_engine(qwen2_dir)
    engine.add_request("a", HEALTHY["ok1"], GREEDY8)
    engine.step()
    snapshot = engine.stats()
    assert snapshot.num_running == 1 and snapshot.kv_blocks_used == 2 and snapshot.computed_tokens == 20

    def walking(cache):
        raise AssertionError("the stats walked the radix tree")

    monkeypatch.setattr(radix_check, "tree_nodes", walking)
    monkeypatch.setattr(radix, "tree_nodes", walking)
    assert engine.stats() is snapshot  # a reader only takes the published reference
    engine.step()  # and the engine thread builds the next one without a walk either
    assert engine.stats() is not snapshot and engine.stats().kv_blocks_used == 2
