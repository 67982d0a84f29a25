"""Engine behaviour with exact expected state: pressure and preemption, aborts, bad input."""

from __future__ import annotations

import pytest

from agentkv.runtime.errors import InvalidTokenError, PromptTooLongError
from agentkv.runtime.outputs import merge_into
from agentkv.runtime.params import SamplingParams
from tests.runtime.test_exactness import make_engine, qwen2_dir, run, tokens  # noqa: F401

GREEDY8 = SamplingParams(max_tokens=8, temperature=0.0)


def test_kv_pressure_32_requests_all_finish_correctly(qwen2_dir):  # noqa: F811
    prompts = {f"r{i}": tokens(20 + (i * 7) % 30, 200 + i, 256) for i in range(32)}
    roomy = make_engine(qwen2_dir, num_blocks=512)
    _, expected = run(roomy, prompts, GREEDY8)
    tight = make_engine(qwen2_dir, num_blocks=12, chunk=64)  # 12 blocks x 16 tokens for 32 requests
    _, got = run(tight, prompts, GREEDY8)
    assert {rid: o.token_ids for rid, o in got.items()} == {rid: o.token_ids for rid, o in expected.items()}
    stats = tight.stats()
    assert stats.preemptions > 0
    assert stats.num_running == stats.num_waiting == 0
    tight.free_cache()
    assert tight.pool.num_free == tight.num_blocks
    tight.pool.check_integrity()
    tight.cache.check_integrity()


def test_abort_frees_kv_at_once(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir, num_blocks=64)
    engine.add_request("a", tokens(40, 1, 256), SamplingParams(max_tokens=50, temperature=0.0))
    engine.add_request("b", tokens(30, 2, 256), SamplingParams(max_tokens=3, temperature=0.0))
    engine.step()
    engine.step()
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort"
    # a's computed prefix may stay cached (evictable); a itself holds nothing any more
    engine.free_cache()
    b = engine._requests["b"].seq
    assert engine.pool.num_used == len(b.block_table)
    while engine.has_unfinished():
        engine.step()
    engine.free_cache()
    assert engine.pool.num_free == engine.num_blocks
    assert engine.abort("a") is None


def test_prefix_hit_reported_and_counted(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir)
    base = tokens(50, 9, 256)
    _, first = run(engine, {"a": base}, GREEDY8)
    assert first["a"].cached_len == 0
    follow = base + first["a"].token_ids + tokens(10, 10, 256)
    _, second = run(engine, {"b": follow}, GREEDY8)
    # everything but the last generated token (its KV is never computed) is reused
    assert second["b"].cached_len == len(base) + len(first["a"].token_ids) - 1
    stats = engine.stats()
    assert stats.prefix_hit_tokens == second["b"].cached_len
    assert stats.prefix_queried_tokens >= len(base) + len(follow) - 2


def test_bad_requests_raise_named_errors(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir)
    with pytest.raises(PromptTooLongError, match="512"):
        engine.add_request("x", [5] * 600, GREEDY8)
    with pytest.raises(InvalidTokenError, match="999"):
        engine.add_request("y", [5, 999], GREEDY8)
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request("z", [], GREEDY8)
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("w", [5, 6], SamplingParams(logit_bias={300: 1.0}))
    assert not engine.has_unfinished()


def test_stop_string_and_length(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir)
    _, outs = run(engine, {"a": tokens(20, 3, 256)}, SamplingParams(max_tokens=5, temperature=0.0))
    assert outs["a"].finish_reason == "length" and len(outs["a"].token_ids) == 5
    text = outs["a"].text
    stop = text[1:3] if len(text) >= 3 else None
    if stop:
        _, outs2 = run(engine, {"b": tokens(20, 3, 256)}, SamplingParams(max_tokens=5, temperature=0.0, stop=[stop]))
        assert outs2["b"].finish_reason == "stop" and outs2["b"].stop_reason == stop
        assert outs2["b"].text == text[: text.index(stop)]


class ExplodingConstraint:
    """A constraint that fails on its second token: a stand-in for a grammar library error."""

    def __init__(self):
        self.num_accepted = 0

    def allowed_mask(self):
        return None

    def accept(self, token_id: int) -> None:
        self.num_accepted += 1
        if self.num_accepted == 2:
            raise RuntimeError("grammar rejected the token")

    def is_finished(self) -> bool:
        return False


def test_one_failing_request_does_not_disturb_others(qwen2_dir):  # noqa: F811
    engine = make_engine(qwen2_dir)
    _, alone = run(engine, {"ok": tokens(20, 5, 256)}, GREEDY8)
    engine.add_request("bad", tokens(25, 6, 256), GREEDY8, constraint=ExplodingConstraint())
    engine.add_request("ok2", tokens(20, 5, 256), GREEDY8)
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
    assert outs["bad"].finish_reason == "error" and "grammar rejected" in outs["bad"].error
    assert outs["ok2"].token_ids == alone["ok"].token_ids and outs["ok2"].error is None
    engine.scheduler.check_integrity()
