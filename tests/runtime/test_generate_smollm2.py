"""SmolLM2 (real, Q4_1 dequantized) greedy continuations: agentkv on both backends vs
transformers loading the same GGUF. Where two continuations differ, the first differing
step must be a near-tie (top-2 logit gap < 1e-3 on both sides), and the test says so."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from agentkv.runtime.llm import LLM
from agentkv.runtime.params import SamplingParams

NEAR_TIE = 1e-3
NUM_TOKENS = 64
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Write a Python function that reverses a string."},
    ],
    [
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": "Red, green and blue."},
        {"role": "user", "content": "And three animals?"},
    ],
]


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    os.environ["HF_HUB_OFFLINE"] = "1"
    return AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def engines():
    return {b: LLM("smollm2", backend=b, weights="f32") for b in ("cpu", "reference")}


def hf_greedy(model, ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
    with torch.no_grad():
        # An explicit mask: SmolLM2's pad id (2) is <|im_end|>, which chat prompts contain, and
        # generate() would otherwise mask those tokens out.
        x = torch.tensor([ids])
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=NUM_TOKENS,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=2,
        )
    return out.sequences[0, len(ids) :].tolist(), [s[0].float().numpy() for s in out.scores]


def ours(llm: LLM, ids: list[int]) -> tuple[list[int], list[np.ndarray]]:
    llm.engine.record_logits = True
    out = llm.generate([ids], SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True))[0]
    return out.token_ids, llm.engine.recorded.pop(out.request_id)


def gap(row: np.ndarray) -> float:
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def assert_same_or_near_tie(a: tuple, b: tuple, label: str) -> None:
    ta, la = a
    tb, lb = b
    n = min(len(ta), len(tb))
    diff = next((i for i in range(n) if ta[i] != tb[i]), None)
    if diff is None:
        return
    ga, gb = gap(la[diff]), gap(lb[diff])
    assert ga < NEAR_TIE and gb < NEAR_TIE, (
        f"{label}: continuations differ at step {diff} and it is not a near-tie (top-2 gaps {ga:.2e}, {gb:.2e})"
    )
    print(f"{label}: first difference at step {diff} is a near-tie (gaps {ga:.2e}, {gb:.2e})")


@pytest.mark.slow
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_greedy_continuations_match_transformers(chat, engines, hf_model):
    llm = engines["cpu"]
    prompt = llm.engine.chat_template.render(CHATS[chat], add_generation_prompt=True)
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    hf = hf_greedy(hf_model, ids)
    ours_torch, ours_ref = ours(llm, ids), ours(engines["reference"], ids)
    assert len(ours_torch[0]) == NUM_TOKENS
    assert_same_or_near_tie(ours_torch, hf, "torch vs transformers")
    assert_same_or_near_tie(ours_ref, hf, "reference vs transformers")
    assert_same_or_near_tie(ours_torch, ours_ref, "torch vs reference")
    with torch.no_grad():  # prompt-end logits from HF's plain forward (generate's scores come
        b = hf_model(torch.tensor([ids])).logits[0, -1].numpy()  # from its cached decode path)
    a = ours_torch[1][0]
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert cos >= 0.99999
