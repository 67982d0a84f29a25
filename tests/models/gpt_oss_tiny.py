"""A tiny random gpt-oss for the tests: transformers' `GptOssForCausalLM` with every
parameter random (HF zero-initialises the expert biases and sets norms to one, which would
hide a missing bias or norm), a window of 16 so that prompts cross it cheaply, and sinks
large enough to move the softmax. Saved with `save_pretrained` in f32 or bf16."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

TINY_GPT_OSS = dict(
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=16,
    max_position_embeddings=4096,
    initializer_range=0.2,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 128,
    },
)


def tiny_gpt_oss(
    folder: Path, vocab_size: int = 128, dtype: torch.dtype = torch.float32, seed: int = 0, truncate: bool = False
):
    """Save a random tiny gpt-oss to `folder` in `dtype`; returns the f32 model holding exactly
    the saved values (bf16-rounded for bf16), the oracle's side. `truncate`: YaRN's correction
    range rounded to whole dims, as llama.cpp computes it (gpt-oss's own config does not)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    rope = {**TINY_GPT_OSS["rope_parameters"], "truncate": truncate}
    config = GptOssConfig(vocab_size=vocab_size, **{**TINY_GPT_OSS, "rope_parameters": rope})
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config).eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(torch.randn_like(p) + 1.0)
            elif "experts" in name:
                p.copy_(0.2 * torch.randn_like(p))
            p.copy_(p.to(dtype).float())  # the saved values, kept in f32 (rope buffers stay f32)
    copy.deepcopy(model).to(dtype).save_pretrained(folder, safe_serialization=True)
    return model


HARMONY_SPECIALS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")
VOCAB = 272  # 256 byte tokens, harmony's special tokens, room to spare


def harmony_tokenizer(folder: Path) -> dict[str, int]:
    """A byte-level tokenizer.json with one merge and harmony's special tokens (ids 257..263):
    the o200k vocabulary cannot be downloaded here. Returns the special tokens' ids by text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {**{ch: i for i, ch in enumerate(alphabet)}, "\u0120\u0120": len(alphabet)}  # one merge: llama.cpp
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("\u0120", "\u0120")]))  # refuses a BPE vocab without
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in HARMONY_SPECIALS}


def tiny_gpt_oss_mxfp4(folder: Path, vocab_size: int = 128, seed: int = 0, truncate: bool = False):
    """The tiny gpt-oss with its experts in MXFP4 as transformers saves them (`*_blocks` uint8
    `[E, out, in/32, 16]`, `*_scales` `[E, out, in/32]`, `quantization_config.quant_method:
    mxfp4`), random codes and scales; returns the f32 model whose experts hold exactly those
    values, decoded by transformers' own `convert_moe_packed_tensors` (the oracle's side)."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = tiny_gpt_oss(folder, vocab_size=vocab_size, seed=seed, truncate=truncate)
    tensors = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for proj in ("gate_up_proj", "down_proj"):
                param = getattr(layer.mlp.experts, proj)  # [E, in, out]
                num, d_in, d_out = param.shape
                blocks = rng.integers(0, 256, (num, d_out, d_in // 32, 16), dtype=np.uint8)
                scales = rng.integers(121, 125, (num, d_out, d_in // 32), dtype=np.uint8)
                name = f"model.layers.{i}.mlp.experts.{proj}"
                decoded = convert_moe_packed_tensors(
                    torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
                )
                param.copy_(decoded)
                del tensors[name]
                tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return model
