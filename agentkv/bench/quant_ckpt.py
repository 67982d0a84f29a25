"""The checkpoints `agentkv bench quant --ckpt` compares, made from one GGUF on the CPU:

    <out>/<model>-w4a16-g<G>-<scale dtype>/  compressed-tensors pack-quantized W4A16 (symmetric,
        group G) of every linear, round-to-nearest from the GGUF's dequantized weights; the
        rest (embeddings, norms) in bf16, as llm-compressor leaves a bf16 model's
    <out>/<model>-q4_0.gguf                  the same dequantized weights as Q4_0 GGUF (token
        embedding Q8_0, norms f32), with the source GGUF's metadata

The packing is compressed-tensors' (int4 offset by 8, eight per int32 along the row, value j at
bits 4j); tests/bench check it against compressed-tensors' own unpack. Both are written once
and reused (the folder or file exists)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCALE_DTYPES = ("float32", "bfloat16")


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _widen_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def w4a16_parts(w: np.ndarray, group: int, scale_dtype: str) -> tuple[dict, np.ndarray]:
    """(compressed-tensors parts {name: (safetensors dtype, array)}, dequantized f32 [out, in])."""
    out, num_in = w.shape
    if num_in % 8:
        raise ValueError(f"in_features {num_in} must be a multiple of 8 (int4 packed eight per int32)")
    group_of = np.arange(num_in) // group  # the last group may be partial, as compressed-tensors allows
    num_groups = int(group_of[-1]) + 1
    absmax = np.stack([np.abs(w[:, group_of == g]).max(1) for g in range(num_groups)], axis=1)
    scale = (absmax / 7.0).astype(np.float32)
    scale[scale == 0] = 1.0
    if scale_dtype == "bfloat16":
        stored, scale = ("BF16", _bf16_bits(scale)), _widen_bf16(_bf16_bits(scale))
    else:
        stored = ("F32", scale)
    full = scale[:, group_of]
    q = np.clip(np.round(w / full), -8, 7).astype(np.int32)
    deq = full * q.astype(np.float32)
    u = (q.reshape(out, num_in // 8, 8) + 8).astype(np.uint32)
    packed = np.zeros((out, num_in // 8), np.uint32)
    for j in range(8):
        packed |= u[:, :, j] << np.uint32(4 * j)
    parts = {
        "weight_packed": ("I32", packed.view(np.int32)),
        "weight_scale": stored,
        "weight_shape": ("I64", np.array([out, num_in], np.int64)),
    }
    return parts, deq


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> int:
    """A safetensors file of (dtype name, array) entries; returns its tensor bytes."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for raw in blobs:
            fh.write(raw)
    return offset


def _hf_model(gguf_path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    return model, AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def write_w4a16(folder: Path, gguf_path: Path, group: int = 128, scale_dtype: str = "float32") -> dict:
    """Writes the W4A16 folder (see the module docstring); returns the dequantized weights
    {HF name: float32 array} that an f32 model of the same checkpoint holds."""
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype {scale_dtype!r}: choose from {', '.join(SCALE_DTYPES)}")
    model, tokenizer = _hf_model(gguf_path)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        "ignore": ["lm_head"],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors, dequantized = {}, {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        w = t.detach().float().numpy()
        prefix, _, leaf = name.rpartition(".")
        if leaf == "weight" and prefix.rpartition(".")[2] in LINEARS:
            parts, dequantized[name] = w4a16_parts(w, group, scale_dtype)
            tensors.update({f"{prefix}.{part}": value for part, value in parts.items()})
        else:
            bits = _bf16_bits(w)
            tensors[name], dequantized[name] = ("BF16", bits), _widen_bf16(bits)
    write_safetensors(folder / "model.safetensors", tensors)
    return dequantized


def write_q4_0_gguf(path: Path, gguf_path: Path) -> None:
    """The source GGUF with every Q4_1 tensor requantized to Q4_0 by gguf-py (from its
    dequantized values); other tensors and all metadata copied as they are."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(path), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)
    if "general.file_type" in reader.fields:
        writer.add_key_value("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_0), gguf.GGUFValueType.UINT32)
    for t in reader.tensors:
        data, qtype = np.asarray(t.data), t.tensor_type
        if qtype == gguf.GGMLQuantizationType.Q4_1:
            qtype = gguf.GGMLQuantizationType.Q4_0
            data = gguf.quants.quantize(gguf.quants.dequantize(data, t.tensor_type), qtype)
        writer.add_tensor(t.name, data, raw_dtype=qtype)  # uint8 data: its byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
