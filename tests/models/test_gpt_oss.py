"""gpt-oss against transformers: a tiny random `GptOssForCausalLM` from safetensors (f32 and
bf16), its sinks, alternating windows, biases, clamped SwiGLU and YaRN rope, on a prompt that
crosses the window several times."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.gpt_oss_tiny import tiny_gpt_oss
from tests.models.helpers import assert_logits_match, hf_logits, our_logits, prompt

# The tiny model's logits agree with transformers' f32 eager run to ~1e-7 (f32 rounding in
# another order); 0.99999 is the bar.
MIN_COS = 0.99999
PROMPT = prompt(40, vocab=128, seed=7)  # 40 > 2 * window: rows inside, at and past the window


@pytest.fixture(scope="module", params=["f32", "bf16"])
def gpt_oss(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gpt_oss_{request.param}")
    dtype = torch.bfloat16 if request.param == "bf16" else torch.float32
    model = tiny_gpt_oss(folder, dtype=dtype)
    return str(folder), hf_logits(model, PROMPT)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_logits_match_transformers(gpt_oss, backend):
    folder, theirs = gpt_oss
    assert_logits_match(our_logits(folder, backend, PROMPT), theirs, MIN_COS)


def test_sinks_and_window_move_the_logits(gpt_oss):
    """The control: transformers without its sinks (or with full attention everywhere) gives
    logits this comparison would reject, so the match above depends on both."""
    folder, theirs = gpt_oss
    ours = our_logits(folder, "reference", PROMPT)
    from transformers import GptOssForCausalLM

    model = GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-1e9)
    no_sinks = hf_logits(model, PROMPT)
    model = GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    for layer in model.model.layers:
        layer.self_attn.sliding_window = None
    model.config.layer_types = ["full_attention"] * len(model.model.layers)
    no_window = hf_logits(model, PROMPT)
    from tests.models.helpers import cosines

    assert cosines(ours, no_sinks).min() < MIN_COS
    assert cosines(ours[20:], no_window[20:]).min() < MIN_COS
    assert np.array_equal(ours.argmax(-1)[:16], theirs.argmax(-1)[:16])
