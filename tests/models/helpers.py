"""Shared model-test helpers: tiny random HF models saved as safetensors, the same weights as a
GGUF written the way llama.cpp's converter writes it, and running both sides on one prompt.

The oracle is always HF transformers in float32 with eager attention (docs/design.md, house style: oracles come
from outside). Imported as `tests.models.helpers` (the Makefile runs `python -m pytest` from
the repository root, where `tests` is a namespace package)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner

BACKENDS = ("reference", "cpu")
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    # HF's 0.02 leaves attention nearly uniform in a 64-wide model, so rope, window
    # and q/k layout would barely move the logits; 0.2 makes the scores peaky.
    initializer_range=0.2,
)


def tiny_hf_model(folder: Path, model_type: str, seed: int = 0, norm_offset: float = 1.0, **overrides):
    """A random-weight HF causal LM of `model_type`, saved to `folder` (safetensors); returns it.

    Norm gains are randomised too (HF initialises them to constants, which would hide a
    missing or misplaced norm): `norm_offset + 0.1 * N(0, 1)` — 1 for llama-style gains,
    0 for gemma's `1 + w`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_offset + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_logits(model, token_ids: list[int]) -> np.ndarray:
    """HF logits `[len, vocab]` float32 for one unbatched prompt."""
    with torch.no_grad():
        out = model(torch.tensor([token_ids], dtype=torch.long))
    return out.logits[0].float().numpy()


def our_logits(
    path: Path | str, backend: str, token_ids: list[int], block_size: int = 4, rows: str = "all"
) -> np.ndarray:
    """agentkv logits for one prompt run cold in a single chunk: `[len, vocab]` for rows="all",
    `[1, vocab]` (the prompt end) for rows="last"."""
    model = load_model(open_model(path), lookup(backend))
    num_blocks = math.ceil(len(token_ids) / block_size)
    runner = ModelRunner(model, num_blocks, block_size)
    return runner.run([Chunk(token_ids, 0, list(range(num_blocks)), rows)])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def assert_logits_match(ours: np.ndarray, theirs: np.ndarray, min_cos: float, rows=None) -> None:
    """Cosine >= min_cos and equal argmax at each row in `rows` (all rows by default)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    rows = np.arange(len(ours)) if rows is None else np.asarray(rows)
    cos = cosines(ours[rows], theirs[rows])
    assert cos.min() >= min_cos, f"min cosine {cos.min():.7f} < {min_cos} (per row: {cos})"
    np.testing.assert_array_equal(ours[rows].argmax(-1), theirs[rows].argmax(-1))


def prompt(length: int, vocab: int = 128, seed: int = 1) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


# ------------------------------------------------------------------------------ GGUF writer


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rope halves -> adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path: Path, arch: str, qtype: str | None = None, byte_vocab: bool = False) -> Path:
    """Write `model`'s weights (float32) and hparams as llama.cpp would for `arch`
    ("llama" or "qwen2"): the arch keys it writes, gguf-py's tensor names, and for llama the
    q/k row permutation. `qtype` (a gguf-py quantizer's name, e.g. "Q8_0") quantizes every
    matrix whose rows are whole blocks; norms and biases stay f32. `byte_vocab` adds a
    256-token byte-level 'gpt2' vocabulary (no merges), so an engine can serve the file.
    Returns `path`."""
    import gguf

    cfg = model.config
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, cfg)
    if byte_vocab:
        from tokenizers import pre_tokenizers

        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([*sorted(pre_tokenizers.ByteLevel.alphabet()), "\u0120\u0120"])
        writer.add_token_merges(["\u0120 \u0120"])
    for hf_name, tensor in model.state_dict().items():
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise KeyError(f"gguf has no name for {hf_name!r}")
        data = tensor.detach().float().numpy().copy()
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = _llama_permute(data, cfg.num_attention_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = _llama_permute(data, cfg.num_key_value_heads)
        if qtype is not None and data.ndim == 2 and data.shape[1] % 32 == 0:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
            continue
        writer.add_tensor(name, data)
    rope = getattr(cfg, "rope_parameters", None) or {}
    if arch == "llama" and rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", _llama3_factors(cfg, rope))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama3_factors(cfg, rope: dict) -> np.ndarray:
    """What llama.cpp's converter writes for llama3 rope scaling: base / scaled frequency."""
    from agentkv.hal.base import RopeSpec
    from agentkv.hal.rope import inv_freq

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = float(rope.get("rope_theta", 10000.0))
    base, _ = inv_freq(RopeSpec(dim=head_dim, theta=theta))
    scaled, _ = inv_freq(RopeSpec(dim=head_dim, theta=theta, scaling={"type": "llama3", **rope}))
    return (base / scaled).astype(np.float32)


def _write_hparams(writer, cfg) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_vocab_size(cfg.vocab_size)
