"""Quantized weights kept resident give the same greedy continuations as the f32-dequantized
path, on SmolLM2 (Q4_1/Q8_0) and Gemma-3-270M (Q4_K_M: Q4_K/Q5_0/Q6_K/Q8_0 mixed). Where two
continuations differ, the first differing step must be a near-tie (top-2 gap < 1e-3)."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.runtime.llm import LLM
from agentkv.runtime.params import SamplingParams
from tests.runtime.test_generate_smollm2 import NEAR_TIE, gap

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
NUM_TOKENS = 64


def continuation(llm: LLM, ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
    llm.engine.record_logits = True
    out = llm.generate([ids], SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True))[0]
    return out.token_ids, llm.engine.recorded.pop(out.request_id)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m"])
def test_resident_matches_f32_greedy(model):
    resident = LLM(model, weights="resident", activation_dtype="f32")  # the f32 path's arithmetic
    f32 = LLM(model, weights="f32")
    formats = resident.engine.model.weight_formats
    assert any(q not in (0, 1) for q in formats.values()), "no weight stayed quantized"
    for text in PROMPTS if model == "smollm2" else PROMPTS[:2]:  # gemma's f32 head is 671 MB a step
        ids = resident.tokenizer.encode(text)
        (ta, la), (tb, lb) = continuation(resident, ids), continuation(f32, ids)
        diff = next((i for i in range(NUM_TOKENS) if ta[i] != tb[i]), None)
        if diff is not None:
            ga, gb = gap(la[diff]), gap(lb[diff])
            assert ga < NEAR_TIE and gb < NEAR_TIE, (
                f"{model} {text!r}: resident and f32 differ at step {diff}, not a near-tie (gaps {ga:.2e}, {gb:.2e})"
            )
            print(f"{model} {text!r}: first difference at step {diff}, a near-tie")
