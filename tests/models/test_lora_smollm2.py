"""A random LoRA adapter on SmolLM2 (the packaged Q4_1 GGUF) against PEFT's PeftModel on the
same weights as transformers loads them from that GGUF (dequantized by gguf-py, q/k rows
unpermuted): agentkv with the weights dequantized to f32 and kept resident in Q4_1 blocks, and
a row's bits alone and batched with a base row and another scale's row."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentkv.formats.lora import read_peft_adapter
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.base import LoadOptions
from agentkv.models.registry import load_model
from agentkv.runtime.adapters import attach
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import assert_logits_match

MIN_COS = 0.99999


@pytest.fixture(scope="module")
def smollm2_peft(smollm2_path, tmp_path_factory):
    """(adapter folder, PEFT logits, HF base logits, prompt)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = [int(t) for t in np.random.default_rng(3).integers(0, base.config.vocab_size, 16)]
    with torch.no_grad():
        base_logits = base(torch.tensor([ids])).logits[0].numpy()
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        use_rslora=True,
        init_lora_weights=False,
        rank_pattern={"o_proj": 4},
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    torch.manual_seed(0)
    model = get_peft_model(base, config).eval()
    folder = tmp_path_factory.mktemp("smollm2_lora")
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
    return folder, logits, base_logits, ids


@pytest.mark.parametrize("weights", ["f32", "resident"])
def test_smollm2_adapter_matches_peft(smollm2_path, smollm2_peft, weights):
    folder, theirs, base_logits, ids = smollm2_peft
    model = load_model(open_model(smollm2_path), lookup("cpu"), LoadOptions(weights=weights))
    adapter = attach(model, read_peft_adapter(folder), "smol")
    runner = ModelRunner(model, math.ceil(len(ids) / 16), 16)
    ours = runner.run([Chunk(ids, 0, list(range(runner.num_blocks)), "all", adapter)])
    assert_logits_match(ours, theirs, MIN_COS)
    assert np.abs(theirs - base_logits).max() > 0.5  # the adapter moves the logits well past the floor
    # the same bits between a base row and a row of the adapter at another scale
    batch = ModelRunner(model, 3, 16)
    other = ids[::-1]
    mixed = batch.run(
        [
            Chunk(other, 0, [0], "all"),
            Chunk(ids, 0, [1], "all", adapter),
            Chunk(other, 0, [2], "all", adapter.scaled(0.5)),
        ]
    )
    assert np.array_equal(mixed[len(other) : len(other) + len(ids)], ours)
