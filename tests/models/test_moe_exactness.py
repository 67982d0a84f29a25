"""The exactness contract (cache on/off, random split points, batch mixes, chunk sizes) on a
tiny Qwen2-MoE model with a shared expert: grouping tokens by expert must never let a token's
bits depend on which other tokens share its batch or chunk. The control backend (a matmul whose
row bits depend on the row count) must be caught on the same model, so the check can fail."""

from __future__ import annotations

import pytest

from tests.models.helpers import tiny_hf_model
from tests.runtime.test_exactness import VARIANT_FAMILIES, SplitKBackend, byte_level_tokenizer, check_contract

MOE = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    head_dim=16,
    norm_topk_prob=False,
    vocab_size=256,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2moe-exact")
    tiny_hf_model(folder, "qwen2_moe", seed=3, **MOE)
    byte_level_tokenizer(folder)
    return str(folder)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_exact_reuse_tiny_qwen2moe(moe_dir, backend):
    assert check_contract(moe_dir, backend, 256, 41, seed=4) == []


def test_control_non_invariant_backend_is_caught_on_moe(moe_dir):
    broken = check_contract(moe_dir, SplitKBackend.name, 256, 41, seed=4)
    caught = {name.split()[0].split("=")[0] for name in broken}
    assert caught == set(VARIANT_FAMILIES), f"a non-invariant matmul went unnoticed on the MoE model: {broken}"
