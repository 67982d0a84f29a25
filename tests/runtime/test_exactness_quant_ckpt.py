"""The exactness contract on quantized safetensors checkpoints: a GPTQ model, a
compressed-tensors W8A16 model and an FP8 block model, each held resident in agentkv's
group-32 blocks by the cpu backend's compiled kernels (I4G32, I8G32, F8G32), give
bit-identical logits with the cache on or off, at random split points, in batch mixes and at
every chunk size (tests/runtime/test_exactness.py's checks, whose control proves they can fail)."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.formats.quants.group32 import AgentQuantType
from agentkv.hal.base import Layout, Weight
from agentkv.hal.registry import register
from agentkv.runtime.loading import weights_summary
from tests.formats import quant_ckpt_writer as qw
from tests.models.helpers import tiny_hf_model
from tests.runtime.test_exactness import (
    VARIANT_FAMILIES,
    SplitKBackend,
    agent_conversation,
    byte_level_tokenizer,
    check_contract,
    make_engine,
)


class SplitKQuantBackend(SplitKBackend):
    """The control for resident weights: each quantized matmul dequantizes its weight with the
    kernels and then sums split-K by row count, as SplitKBackend does for f32 weights."""

    name = "cpu-split-k-quant"

    def matmul(self, x, weight, bias=None):
        if weight.layout is not Layout.GGUF_ROWS:
            return super().matmul(x, weight, bias)
        w = self._kernels.dequantize(weight.raw, weight.qtype, weight.shape[0], weight.shape[1])
        return super().matmul(x, Weight(w, weight.shape, 0, weight.name, layout=Layout.ROW_MAJOR_F32), bias)


register(SplitKQuantBackend.name, SplitKQuantBackend, "approx")

CT_W8A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        }
    },
    "ignore": ["lm_head"],
}
CASES = {
    # 4-bit asymmetric g32: zero points vary, so not Q4_0 -> I4G32
    "gptq-int4-asym": (
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False},
        lambda w, r: qw.gptq_parts(w, 4, 32, False, False, False, r),
        AgentQuantType.I4G32,
    ),
    # 8-bit per-channel, float32 scales (not f16-exact) -> I8G32
    "ct-w8a16-channel": (
        CT_W8A16,
        lambda w, r: qw.compressed_int_parts(w, 8, None, True, False, r),
        AgentQuantType.I8G32,
    ),
    "hf-fp8-block": (
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32]},
        lambda w, r: qw.fp8_parts(w, "block", (32, 32), "weight_scale_inv"),
        AgentQuantType.F8G32,
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("quant-exactness")
    plain = tiny_hf_model(root / "plain", "llama", seed=5, vocab_size=256, max_position_embeddings=512)
    folders = {}
    for case, (config, make, _) in CASES.items():
        rng = np.random.default_rng(11)
        qw.write_checkpoint(root / case, plain, config, lambda n, w, make=make, rng=rng: make(w, rng))
        byte_level_tokenizer(root / case)
        folders[case] = str(root / case)
    return folders


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_weights_are_resident_in_their_group32_blocks(checkpoints, case):
    """Precondition of the checks below: the kernels under test are the group-32 ones (an
    uploaded weight's qtype is what the backend holds: 0 had it fallen back to f32)."""
    engine = make_engine(checkpoints[case])
    linears = {n: q for n, q in engine.model.weight_formats.items() if "attn_q" in n or "ffn_down" in n}
    assert linears and set(linears.values()) == {int(CASES[case][2])}
    assert "dequantized to f32" not in weights_summary(engine.source, engine.model)


@pytest.mark.parametrize("case", list(CASES))
def test_exact_reuse_quantized_checkpoint(checkpoints, case):
    assert check_contract(checkpoints[case], "cpu", 256, 45, seed=4) == []


@pytest.mark.parametrize("case", ["gptq-int4-asym", "ct-w8a16-channel"])
def test_agent_turns_identical_with_cache_on_and_off(checkpoints, case):
    on = make_engine(checkpoints[case])
    off = make_engine(checkpoints[case], prefix_cache=False)
    assert agent_conversation(on, 256) == agent_conversation(off, 256)
    assert on.stats().prefix_hit_tokens > 0 and off.stats().prefix_hit_tokens == 0


def test_control_non_invariant_quantized_matmul_is_caught_by_every_variant_family(checkpoints):
    broken = check_contract(checkpoints["gptq-int4-asym"], SplitKQuantBackend.name, 256, 45, seed=4)
    caught = {name.split()[0].split("=")[0] for name in broken}
    assert caught == set(VARIANT_FAMILIES), f"unnoticed by {set(VARIANT_FAMILIES) - caught} (broken: {broken})"
