"""SmolLM2 as a compressed-tensors W4A16 checkpoint (symmetric, group 128, float32 scales, made
from its GGUF dequantized by agentkv.bench.quant_ckpt): the packing equals compressed-tensors'
own unpack, the cpu backend holds the linears in I4G32 blocks and the embedding in bf16
(resident, within 1.25x of the checkpoint's tensor bytes), and its greedy 64-token
continuations equal transformers' on the dequantized f32 weights, or first differ at a
reported near-tie; against agentkv's own f32 copy of the same weights they are bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.bench.quant_ckpt import write_w4a16
from agentkv.bench.quant_profile import tensor_bytes
from agentkv.formats.quants.group32 import AgentQuantType
from agentkv.formats.safetensors import SafetensorsSource
from agentkv.runtime.llm import LLM
from tests.runtime.test_generate_smollm2 import CHATS, NUM_TOKENS, assert_same_or_near_tie, hf_greedy, ours

# I4G32 holds 24 bytes per 32 weights where the checkpoint has 16 + its group-128 scale: the
# linears grow by 1.41x, the bf16 embedding (half the bytes) not at all.
MAX_HELD_VS_CHECKPOINT = 1.25


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("smollm2-w4a16")
    dequantized = write_w4a16(folder, smollm2_path, group=128, scale_dtype="float32")
    return folder, dequantized


@pytest.fixture(scope="module")
def hf_dequantized(checkpoint, smollm2_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()
    missing = model.load_state_dict({k: torch.from_numpy(v) for k, v in checkpoint[1].items()}, strict=False)
    assert missing.unexpected_keys == [] and set(missing.missing_keys) <= {"lm_head.weight"}
    model.tie_weights()
    return model


def test_packing_equals_compressed_tensors_unpack(checkpoint):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from safetensors.torch import load_file

    folder, dequantized = checkpoint
    parts = load_file(str(folder / "model.safetensors"))
    prefix = "model.layers.3.mlp.down_proj"
    shape = torch.Size(parts[f"{prefix}.weight_shape"].tolist())
    q = unpack_from_int32(parts[f"{prefix}.weight_packed"], 4, shape).float()
    scale = parts[f"{prefix}.weight_scale"].repeat_interleave(128, dim=1)[:, : shape[1]]
    assert torch.equal(scale * q, torch.from_numpy(dequantized[f"{prefix}.weight"]))
    ours_f32 = SafetensorsSource(folder).dequantized("blk.3.ffn_down.weight")
    assert np.array_equal(ours_f32, dequantized[f"{prefix}.weight"])


@pytest.fixture(scope="module")
def engines(checkpoint):
    folder = str(checkpoint[0])
    return {w: LLM(folder, backend="cpu", weights=w) for w in ("resident", "f32")}


def test_held_resident_in_i4g32_and_bf16(checkpoint, engines):
    formats = engines["resident"].engine.model.weight_formats
    assert formats["blk.0.attn_q.weight"] == AgentQuantType.I4G32
    assert formats["token_embd.weight"] == 30  # BF16, also the tied output head
    checkpoint_bytes = (checkpoint[0] / "model.safetensors").stat().st_size
    assert tensor_bytes(engines["resident"].engine.model) <= MAX_HELD_VS_CHECKPOINT * checkpoint_bytes


@pytest.mark.slow
@pytest.mark.parametrize("chat", range(2))
def test_greedy_64_tokens_equal_the_dequantized_f32_model(chat, engines, hf_dequantized):
    llm = engines["resident"]
    prompt = llm.engine.chat_template.render(CHATS[chat], add_generation_prompt=True)
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    resident, f32 = ours(llm, ids), ours(engines["f32"], ids)
    assert len(resident[0]) == NUM_TOKENS
    assert resident[0] == f32[0] and all(np.array_equal(a, b) for a, b in zip(resident[1], f32[1]))
    assert_same_or_near_tie(resident, hf_greedy(hf_dequantized, ids), "W4A16 resident vs transformers f32")
