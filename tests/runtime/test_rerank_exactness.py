"""A causal reranker's judgements with the shared instruction + query served from the radix
cache are bit-identical to each pair judged cold (docs/design.md, the exactness contract):
`np.array_equal` on the raw float32 yes/no logits the engine reports. The control runs the
same comparison on a backend whose matmul is not batch-invariant and must see a difference,
so the check can fail."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.rerank import judge_ids, pair_prompt
from tests.models import retrieval_helpers as rh
from tests.runtime.test_exactness import SplitKBackend


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-reranker")
    rh.qwen3(folder, embedding=False, seed=1)
    return str(folder)


def judge(engine: Engine, prompts: list[list[int]], together: bool) -> tuple[np.ndarray, list[int]]:
    """(yes/no logits `[len(prompts), 2]`, cached_len per prompt): all prompts admitted at
    once in one namespace (`together`: the shared prefix is computed once), or each alone in
    a namespace of its own (cold)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logit_token_ids=judge_ids(engine.tokenizer))
    logits, cached = {}, {}

    def drain() -> None:
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    logits[out.request_id], cached[out.request_id] = out.logprobs[0].logits, out.cached_len

    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, params, namespace="shared" if together else ("cold", i))
        if not together:
            drain()
    drain()
    engine.scheduler.check_integrity()
    keys = [str(i) for i in range(len(prompts))]
    return np.array([logits[k] for k in keys], dtype=np.float32), [cached[k] for k in keys]


def warm_and_cold(path: str, backend: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    engine = Engine(EngineConfig(model=path, backend=backend, cache=CacheConfig(num_blocks=128)))
    prompts = [pair_prompt(engine.tokenizer, rh.QUERY, doc) for doc in rh.DOCUMENTS]
    warm, cached = judge(engine, prompts, together=True)
    cold, cold_cached = judge(engine, prompts, together=False)
    assert cold_cached == [0] * len(prompts)
    return warm, cold, cached


def test_shared_prefix_scores_equal_cold_scores_bit_for_bit(reranker_dir):
    warm, cold, cached = warm_and_cold(reranker_dir, "cpu")
    assert cached[0] == 0 and all(n > 0 for n in cached[1:])  # the query was prefilled once
    assert np.array_equal(warm, cold)


def test_control_a_non_invariant_backend_is_caught(reranker_dir):
    warm, cold, cached = warm_and_cold(reranker_dir, SplitKBackend.name)
    assert all(n > 0 for n in cached[1:])
    assert not np.array_equal(warm, cold)
