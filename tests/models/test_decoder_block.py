"""The cpu backend's compiled decoder block (hal/kernels/layer.cpp) runs the same kernels in
the same order as Backend.decoder_block's composition of single ops, and the whole stack of
them runs as one call (DecoderStack): logits and KV are equal bit for bit, on both real models
(llama with fused q/k/v; gemma3 with post norms, q/k norms, local/global rope and layers whose
q/k/v stay separate)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.cpu import CpuBackend
from agentkv.runtime.llm import LLM
from agentkv.runtime.params import SamplingParams

PROMPT = "Tool result: 17 files changed. Next step:"


def run(model: str, compiled: bool, monkeypatch) -> tuple[list[np.ndarray], torch.Tensor, int]:
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(CpuBackend, "_compiled_block", lambda *args: None)
        llm = LLM(model, backend="cpu", enable_prefix_cache=False, max_model_len=128)
        llm.engine.record_logits = True
        ids = llm.tokenizer.encode(PROMPT)
        out = llm.generate([ids], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
        kv = llm.engine.runner.kv
        used = sum(entry[3] is not None for key, entry in kv.decoder_blocks.items() if key != "stack")
        stack = kv.decoder_blocks["stack"][4]  # the whole stack as one call, when every block compiled
        assert (stack is not None) == compiled
        assert not compiled or len(stack[0]) == len(llm.engine.runner.model.layers)
        return llm.engine.recorded.pop(out.request_id), kv.k.clone(), used


@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m"])
def test_compiled_block_equals_composed_ops(model, monkeypatch):
    from agentkv.hal.kernels import load

    try:
        load()
    except BackendUnavailable as e:
        pytest.skip(f"no compiled kernels here: {e}")
    fast_logits, fast_k, used = run(model, True, monkeypatch)
    slow_logits, slow_k, unused = run(model, False, monkeypatch)
    assert used > 0 and unused == 0  # the two runs really took the two paths
    assert len(fast_logits) == len(slow_logits)
    for a, b in zip(fast_logits, slow_logits):
        assert np.array_equal(a, b)
    assert torch.equal(fast_k, slow_k)
