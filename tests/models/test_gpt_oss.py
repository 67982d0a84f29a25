"""gpt-oss against transformers: a tiny random `GptOssForCausalLM` from safetensors (f32, bf16
and MXFP4 experts as transformers saves them), its sinks, alternating windows, biases,
clamped SwiGLU and YaRN rope, on a prompt that crosses the window several times."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.models.gpt_oss_tiny import tiny_gpt_oss, tiny_gpt_oss_mxfp4
from tests.models.helpers import assert_logits_match, cosines, hf_logits, our_logits, prompt

# The tiny model's logits agree with transformers' f32 eager run to ~1e-7 (f32 rounding in
# another order); 0.99999 is the bar.
MIN_COS = 0.99999
PROMPT = prompt(40, vocab=128, seed=7)  # 40 > 2 * window: rows inside, at and past the window


@pytest.fixture(scope="module", params=["f32", "bf16", "mxfp4"])
def gpt_oss(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gpt_oss_{request.param}")
    if request.param == "mxfp4":
        model = tiny_gpt_oss_mxfp4(folder)
    else:
        model = tiny_gpt_oss(folder, dtype=torch.bfloat16 if request.param == "bf16" else torch.float32)
    return str(folder), hf_logits(model, PROMPT)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_logits_match_transformers(gpt_oss, backend):
    folder, theirs = gpt_oss
    assert_logits_match(our_logits(folder, backend, PROMPT), theirs, MIN_COS)


def test_sinks_and_window_move_the_logits(tmp_path):
    """The control: transformers without its sinks, or with full attention everywhere, gives
    logits this comparison would reject, so the match above depends on both."""
    model = tiny_gpt_oss(tmp_path)
    ours = our_logits(str(tmp_path), "reference", PROMPT)
    no_sinks = copy.deepcopy(model)
    with torch.no_grad():
        for layer in no_sinks.model.layers:
            layer.self_attn.sinks.fill_(-1e9)
    no_window = copy.deepcopy(model)
    for layer in no_window.model.layers:
        layer.self_attn.sliding_window = None
    no_window.config.layer_types = ["full_attention"] * len(no_window.model.layers)
    assert_logits_match(ours, hf_logits(model, PROMPT), MIN_COS)
    assert cosines(ours, hf_logits(no_sinks, PROMPT)).min() < MIN_COS
    assert cosines(ours[17:], hf_logits(no_window, PROMPT)[17:]).min() < MIN_COS
    assert np.array_equal(ours[:16], our_logits(str(tmp_path), "reference", PROMPT[:16]))
