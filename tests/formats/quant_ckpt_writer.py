"""The project's writer of quantized safetensors checkpoints, for tests: round-to-nearest codes
of a tiny model's linears, packed as GPTQ, AWQ, compressed-tensors or FP8 store them.

The packing is checked against the libraries' own unpackers in test_quant_ckpt.py; each writer
also returns the dequantized weights, which a transformers model loads as the logits oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def rtn(w: np.ndarray, group: np.ndarray, num_groups: int, bits: int, sym: bool, scale_dtype) -> tuple:
    """Round-to-nearest codes of w [out, in]: (q uint8 [out, in], scale [out, G] in scale_dtype,
    zero int [out, G]), x ~ scale * (q - zero)."""
    out = w.shape[0]
    scale = np.zeros((out, num_groups), np.float32)
    zero = np.zeros((out, num_groups), np.int64)
    top = (1 << bits) - 1
    for g in range(num_groups):
        cols = w[:, group == g]
        if sym:
            s = np.abs(cols).max(1) / ((1 << (bits - 1)) - 1)
            z = np.full(out, 1 << (bits - 1))
        else:
            lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
            s = (hi - lo) / top
            z = np.clip(np.round(-lo / s), 0, top)
        scale[:, g], zero[:, g] = np.asarray(s, dtype=scale_dtype).astype(np.float32), z
    q = np.clip(np.round(w / scale[:, group]) + zero[:, group], 0, top).astype(np.uint8)
    return q, scale.astype(scale_dtype), zero


def dequant(q, scale, zero, group) -> np.ndarray:
    return scale.astype(np.float32)[:, group] * (q.astype(np.float32) - zero[:, group].astype(np.float32))


def pack_along_first(values: np.ndarray, bits: int) -> np.ndarray:
    """uint [n, m] -> int32 [n / p, m]: value r*p + j in bit slot j (GPTQ qweight)."""
    p = 32 // bits
    v = values.astype(np.uint32).reshape(-1, p, values.shape[1])
    words = np.zeros((v.shape[0], v.shape[2]), np.uint32)
    for j in range(p):
        words |= v[:, j] << np.uint32(bits * j)
    return words.view(np.int32)


def pack_along_last(values: np.ndarray, bits: int, order=None) -> np.ndarray:
    """uint [n, m] -> int32 [n, m / p]: column c*p + order[j] in slot j."""
    p = 32 // bits
    order = order or tuple(range(p))
    v = values.astype(np.uint32).reshape(values.shape[0], -1, p)
    words = np.zeros(v.shape[:2], np.uint32)
    for j in range(p):
        words |= v[:, :, order[j]] << np.uint32(bits * j)
    return words.view(np.int32)


def _groups(num_in: int, group_size: int, desc_act: bool, rng) -> tuple[np.ndarray, int]:
    gs = num_in if group_size == -1 else group_size
    if not desc_act:
        return np.arange(num_in) // gs, num_in // gs
    perm = rng.permutation(num_in)  # act-order: groups of gs columns in a random column order
    group = np.empty(num_in, np.int64)
    group[perm] = np.arange(num_in) // gs
    return group, num_in // gs


def gptq_parts(w, bits, group_size, sym, v2, desc_act, rng) -> tuple[dict, np.ndarray]:
    group, num_groups = _groups(w.shape[1], group_size, desc_act, rng)
    q, scale, zero = rtn(w, group, num_groups, bits, sym, np.float16)
    stored = zero if v2 else (zero - 1) & ((1 << bits) - 1)
    parts = {
        "qweight": pack_along_first(q.T, bits),
        "qzeros": pack_along_last(stored.T, bits),
        "scales": scale.T.copy(),
        "g_idx": group.astype(np.int32),
    }
    return parts, dequant(q, scale, zero, group)


def awq_parts(w, group_size, rng) -> tuple[dict, np.ndarray]:
    group, num_groups = _groups(w.shape[1], group_size, False, rng)
    q, scale, zero = rtn(w, group, num_groups, 4, False, np.float16)
    parts = {
        "qweight": pack_along_last(q.T, 4, AWQ_ORDER),
        "qzeros": pack_along_last(zero.T, 4, AWQ_ORDER),
        "scales": scale.T.copy(),
    }
    return parts, dequant(q, scale, zero, group)


def compressed_int_parts(w, bits, group_size, sym, actorder, rng, scale_dtype=np.float32) -> tuple[dict, np.ndarray]:
    """compressed-tensors pack-quantized, packed by compressed-tensors' own pack_to_int32."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    group, num_groups = _groups(w.shape[1], group_size if group_size else -1, actorder, rng)
    q, scale, zero = rtn(w, group, num_groups, bits, sym, scale_dtype)
    offset = 1 << (bits - 1)
    signed = torch.from_numpy(q.astype(np.int16) - offset).to(torch.int8)
    parts = {
        "weight_packed": pack_to_int32(signed, bits).numpy(),
        "weight_scale": scale,
        "weight_shape": np.array(w.shape, np.int64),
    }
    if not sym:
        zp = torch.from_numpy(zero - offset).to(torch.int8)
        parts["weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0).numpy()
    if actorder:
        parts["weight_g_idx"] = group.astype(np.int32)
    return parts, dequant(q, scale, zero, group)


def fp8_parts(w, strategy: str, block=(128, 128), scale_name="weight_scale") -> tuple[dict, np.ndarray]:
    """e4m3 codes by torch's float8 cast; scale per tensor, per row, or per block."""
    out, num_in = w.shape
    bm, bn = {"tensor": (out, num_in), "channel": (1, num_in), "block": block}[strategy]
    rows, cols = -(-out // bm), -(-num_in // bn)
    scale = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        for c in range(cols):
            scale[r, c] = np.abs(w[r * bm : (r + 1) * bm, c * bn : (c + 1) * bn]).max() / 448.0
    full = scale[np.arange(out) // bm][:, np.arange(num_in) // bn]
    codes = torch.from_numpy(w / full).to(torch.float8_e4m3fn)
    stored = scale.reshape(1) if strategy == "tensor" else scale
    values = codes.to(torch.float32).numpy() * full
    return {"weight": codes, scale_name: stored}, values


def write_checkpoint(folder: Path, model, quant_config: dict, make_parts) -> dict[str, torch.Tensor]:
    """Save `model`'s config and weights to `folder` with each linear replaced by
    `make_parts(name, w)` -> (parts, dequantized); returns the dequantized state dict."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quant_config
    (folder / "config.json").write_text(json.dumps(config))
    tensors, dequantized = {}, {}
    for name, tensor in model.state_dict().items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and prefix.rpartition(".")[2] in LINEARS:
            parts, values = make_parts(name, tensor.detach().float().numpy())
            for part, value in parts.items():
                if not isinstance(value, torch.Tensor):
                    value = torch.from_numpy(np.ascontiguousarray(value))
                tensors[f"{prefix}.{part}"] = value
            dequantized[name] = torch.from_numpy(np.asarray(values, np.float32))
        elif name != "lm_head.weight" or not model.config.tie_word_embeddings:
            tensors[name] = tensor.detach().contiguous()
            dequantized[name] = tensor.detach()
    save_file(tensors, str(folder / "model.safetensors"))
    return dequantized
