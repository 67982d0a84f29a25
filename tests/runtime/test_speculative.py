"""Speculative decoding never changes an answer: tokens, logprobs and the sampled logits rows
with speculation are bit-identical to plain decode, greedy and seeded, alone and batched, with
the prefix cache on. A control backend whose matmul bits depend on the number of rows shows
the comparison can fail: there, verifying k+1 rows at once is caught."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.outputs import merge_into
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from agentkv.sched.draft import DRAFTERS, NgramDrafter
from tests.models.helpers import tiny_hf_model
from tests.runtime.test_exactness import SplitKBackend, byte_level_tokenizer

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, logprobs=3)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=123, logprobs=2)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    tiny_hf_model(folder, "qwen2", seed=3, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(folder)
    return str(folder)


def make_engine(model, speculative=None, backend="cpu", k=6, prefix_cache=True, kv_dtype="f32") -> Engine:
    engine = Engine(
        EngineConfig(
            model=model,
            backend=backend,
            speculative=speculative,
            num_speculative_tokens=k,
            cache=CacheConfig(num_blocks=256, enable_prefix_cache=prefix_cache, dtype=kv_dtype),
            scheduler=SchedulerConfig(max_num_batched_tokens=256),
        )
    )
    engine.record_logits = True
    return engine


def copy_prompt(seed: int, vocab: int, n: int = 40) -> list[int]:
    """A prompt that repeats itself, so prompt lookup drafts often and is often right."""
    rnd = random.Random(seed)
    chunk = [rnd.randrange(3, vocab) for _ in range(n // 2)]
    return chunk + chunk[: n // 4] + [rnd.randrange(3, vocab) for _ in range(3)] + chunk


def run(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Submit all at once, step to completion checking the pool after every step;
    request id -> (token ids, logprobs, finish reason, sampled logits rows)."""
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params)
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
        engine.scheduler.check_integrity()
    return {rid: (o.token_ids, o.logprobs or [], o.finish_reason, engine.recorded.pop(rid)) for rid, o in outs.items()}


def same(a, b) -> bool:
    """Exact equality of tokens, logprobs, finish reason and every logits row's bits."""
    return (
        all(
            a[r][:3] == b[r][:3]
            and len(a[r][3]) == len(b[r][3])
            and all(np.array_equal(x, y) for x, y in zip(a[r][3], b[r][3]))
            for r in a
        )
        and a.keys() == b.keys()
    )


class OracleDrafter(NgramDrafter):
    """A test drafter that knows plain decode's answers and drafts them with one wrong token
    at a varying place, so verification both accepts and rolls back on every request."""

    name = "oracle"
    truth: dict[tuple[int, ...], list[int]] = {}

    def propose(self, key, context, num_tokens):
        for prompt, answer in self.truth.items():
            done = len(context) - len(prompt)
            if done >= 0 and tuple(context[: len(prompt)]) == prompt and list(context[len(prompt) :]) == answer[:done]:
                draft = list(answer[done : done + num_tokens])
                wrong = (len(context) * 7) % (num_tokens + 3)
                if wrong < len(draft):
                    draft[wrong] = (draft[wrong] + 1) % 256
                return draft
        return []


@pytest.fixture
def oracle(monkeypatch):
    monkeypatch.setitem(DRAFTERS, "oracle", OracleDrafter)
    monkeypatch.setattr(OracleDrafter, "truth", {})
    return OracleDrafter


def workload(vocab: int, params: SamplingParams, batched: bool) -> dict:
    requests = {"p": (copy_prompt(1, vocab), params)}
    if batched:
        requests["q"] = (copy_prompt(2, vocab, 30), SEEDED)
        requests["g"] = (copy_prompt(3, vocab, 24), GREEDY)
        requests["off"] = (copy_prompt(4, vocab, 20), SamplingParams(max_tokens=9, temperature=0.0, speculative=False))
        requests["r"] = (
            [5, 6, 7, 8] * 6,
            SamplingParams(max_tokens=17, temperature=0.7, seed=9, repetition_penalty=1.3),
        )
    return requests


def spec_run(model, drafter, requests, plain, backend="cpu", k=6):
    """The requests on a speculating engine whose cache already holds part of "p"; for the
    suffix drafter the same requests ran once before, so its global index drafts them."""
    engine = make_engine(model, drafter, backend=backend, k=k)
    run(engine, {"warm": (requests["p"][0][:30], GREEDY)})
    if drafter == "suffix":
        run(engine, requests)
    OracleDrafter.truth.update({tuple(requests[r][0]): plain[r][0] for r in plain})
    return run(engine, requests), engine.stats()


@pytest.mark.parametrize("drafter", ["oracle", "suffix"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("batched", [False, True], ids=["alone", "batched"])
def test_speculation_is_bit_identical_tiny_qwen2(qwen2_dir, oracle, drafter, params, batched):
    requests = workload(256, params, batched)
    plain = run(make_engine(qwen2_dir), requests)
    spec, stats = spec_run(qwen2_dir, drafter, requests, plain)
    assert same(spec, plain)
    assert stats.prefix_hit_tokens > 0
    assert 0 < stats.spec_accepted_tokens <= stats.spec_drafted_tokens
    if drafter == "oracle":  # it drafts one wrong token in most drafts: rollback ran too
        assert stats.spec_accepted_tokens < stats.spec_drafted_tokens


def test_stop_inside_accepted_tokens_ends_where_plain_decode_ends(qwen2_dir, oracle):
    plain0 = run(make_engine(qwen2_dir), {"p": (copy_prompt(1, 256), GREEDY)})
    stop_id = plain0["p"][0][9]
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, stop_token_ids=[stop_id])
    requests = {"p": (copy_prompt(1, 256), params)}
    plain = run(make_engine(qwen2_dir), requests)
    OracleDrafter.truth[tuple(requests["p"][0])] = plain0["p"][0]  # drafts run past the stop
    spec, stats = spec_run(qwen2_dir, "oracle", requests, {})
    assert plain["p"][2] == "stop" and len(plain["p"][0]) <= 10
    assert same(spec, plain) and stats.spec_accepted_tokens > 0


def test_control_a_row_count_dependent_matmul_is_caught(qwen2_dir, oracle):
    """On a backend whose matmul splits K by the number of rows, a verification chunk's rows
    differ from decode's: the same comparison fails, so it can fail."""
    requests = workload(256, GREEDY, batched=False)
    plain = run(make_engine(qwen2_dir, backend=SplitKBackend.name), requests)
    spec, stats = spec_run(qwen2_dir, "oracle", requests, plain, backend=SplitKBackend.name, k=4)
    assert stats.spec_drafted_tokens > 0
    assert not same(spec, plain)
    assert same(run(make_engine(qwen2_dir, backend=SplitKBackend.name), requests), plain)  # reruns agree


TOOL_RESULT = (
    "def load_config(path):\n    with open(path) as f:\n        data = json.load(f)\n"
    "    if 'version' not in data:\n        raise ValueError('config has no version')\n    return data\n"
)


def real_requests(engine: Engine) -> dict:
    """Agent turns that copy a tool result (greedy and seeded), and one that opted out."""
    tok = engine.tokenizer
    copy = tok.encode(f"Tool result:\n{TOOL_RESULT}\nRepeat the tool result exactly:\n{TOOL_RESULT[:20]}")
    edit = tok.encode(f"File:\n{TOOL_RESULT}\nThe same file with load_config renamed to read_config:\ndef read_config")
    return {
        "copy": (copy, SamplingParams(max_tokens=32, temperature=0.0, logprobs=2)),
        "edit": (edit, SamplingParams(max_tokens=24, temperature=0.6, seed=7, logprobs=1)),
        "off": (copy, SamplingParams(max_tokens=6, temperature=0.0, speculative=False)),
    }


def check_real_model(model: str) -> None:
    plain_engine = make_engine(model)
    requests = real_requests(plain_engine)
    plain = run(plain_engine, requests)
    engine = make_engine(model, "ngram", k=8)
    spec = run(engine, requests)
    stats = engine.stats()
    assert same(spec, plain)
    assert stats.spec_accepted_tokens > 0 and stats.prefix_hit_tokens > 0


def test_speculation_is_bit_identical_smollm2():
    check_real_model("smollm2")


def test_speculation_is_bit_identical_gemma3():  # 10-30 s here, by the machine's load
    check_real_model("gemma3-270m")


def test_knobs_and_flags_configure_speculation():
    import argparse

    from agentkv.commands.config_flags import add_engine_arguments, config_from_args
    from agentkv.runtime.config import engine_config

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["m", "--speculative", "suffix", "--num-speculative-tokens", "5"])
    assert config_from_args(args) == engine_config("m", speculative="suffix", num_speculative_tokens=5)
    assert config_from_args(parser.parse_args(["m"])).speculative is None
    with pytest.raises(ValueError, match="speculative='eagle' is not allowed"):
        engine_config("m", speculative="eagle")
    with pytest.raises(ValueError, match=r"num_speculative_tokens=0 is out of range: allowed an integer \[1, 64\]"):
        engine_config("m", num_speculative_tokens=0)
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "--speculative", "eagle"])
