"""The tiny MoE models of test_moe.py as GGUFs written the way llama.cpp's converter writes them
(gguf-py's GGUFWriter and tensor names; per-expert HF tensors stacked into the 3-D
`ffn_{gate,up,down}_exps`; llama/mixtral q/k rows permuted; llama.cpp's own per-arch
renormalisation, which these configs agree with), in F32 and with Q8_0 experts.

F32: the same floor as from safetensors (cosine >= 0.99999, argmax equal). Q8_0: the experts
stay quantized (the load log and `weight_formats` say so), and the cpu backend's logits agree
with the reference backend's on the same file at the quantized-kernel witness floor."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from agentkv.bench.moe_model import write_vocab
from agentkv.cli import main
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.witness.ops import COSINE_FLOOR_QUANT
from tests.models.helpers import (
    _llama_permute,
    _write_hparams,
    assert_logits_match,
    cosines,
    our_logits,
)
from tests.models.test_moe import MIN_COS, built

GGUF_ARCH = {"qwen2moe": "qwen2moe", "qwen3moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe"}
EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
HF_PROJ = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def write_moe_gguf(folder: Path, path: Path, arch: str, expert_qtype=None, vocab: bool = False) -> Path:
    """The folder's safetensors as a GGUF of `arch`; experts quantized to `expert_qtype`;
    `vocab` adds a token list (llama.cpp refuses a file without one)."""
    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, cfg["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(path), arch)
    _write_hparams(writer, _Cfg(cfg))
    _write_moe_hparams(writer, cfg)
    if vocab:
        write_vocab(writer, cfg["vocab_size"])
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for hf_name, data in tensors.items():
        m = EXPERT.fullmatch(hf_name)
        if m:
            experts.setdefault((int(m[1]), HF_PROJ[m[3]]), {})[int(m[2])] = data
            continue
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in hf_name else cfg["num_key_value_heads"]
            data = _llama_permute(data, heads)
        writer.add_tensor(name, data.reshape(-1) if name.endswith("ffn_gate_inp_shexp.weight") else data)
    for (layer, proj), by_expert in sorted(experts.items()):
        stacked = np.stack([by_expert[e] for e in range(len(by_expert))]).astype(np.float32)
        name = f"blk.{layer}.ffn_{proj}_exps.weight"
        if expert_qtype is None:
            writer.add_tensor(name, stacked)
        else:
            writer.add_tensor(name, gguf.quants.quantize(stacked, expert_qtype), raw_dtype=expert_qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class _Cfg:
    """config.json as the attribute object helpers._write_hparams reads."""

    def __init__(self, cfg: dict):
        self.__dict__.update(cfg)


def _write_moe_hparams(writer, cfg: dict) -> None:
    writer.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("moe_intermediate_size"):
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name", sorted(GGUF_ARCH))
def test_f32_gguf_matches_transformers(name, backend, tmp_path_factory, tmp_path):
    folder, _, expected, ids = built(name, tmp_path_factory)
    path = write_moe_gguf(folder, tmp_path / f"{name}.gguf", GGUF_ARCH[name])
    assert_logits_match(our_logits(path, backend, ids), expected, MIN_COS)


@pytest.mark.parametrize("name", sorted(GGUF_ARCH))
def test_q8_0_experts_stay_quantized(name, tmp_path_factory, tmp_path, caplog):
    folder, _, _, ids = built(name, tmp_path_factory)
    path = write_moe_gguf(folder, tmp_path / f"{name}-q8.gguf", GGUF_ARCH[name], Q8_0)
    with caplog.at_level(logging.INFO, logger="agentkv.models.moe"):
        model = load_model(open_model(path), lookup("cpu"))
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    assert model.expert_formats == {
        f"blk.{i}.ffn_{p}_exps.weight": (Q8_0, Q8_0) for i in range(layers) for p in ("gate", "up", "down")
    }
    assert f"{3 * layers} expert tensors resident: {3 * layers} Q8_0" in caplog.text
    assert "dequantized" not in caplog.text
    cpu, ref = our_logits(path, "cpu", ids), our_logits(path, "reference", ids)
    assert cosines(cpu, ref).min() >= COSINE_FLOOR_QUANT


def test_f32_load_says_experts_became_f32(tmp_path_factory, tmp_path, caplog):
    """The control of the log line: `--weights f32` dequantizes the Q8_0 experts, and says so."""
    from agentkv.models.base import LoadOptions

    folder, _, _, _ = built("qwen3moe", tmp_path_factory)
    path = write_moe_gguf(folder, tmp_path / "q8.gguf", "qwen3moe", Q8_0)
    with caplog.at_level(logging.INFO, logger="agentkv.models.moe"):
        load_model(open_model(path), lookup("cpu"), LoadOptions("f32"))
    assert "6 expert tensors resident: none; dequantized to f32: 6 Q8_0" in caplog.text


def test_inspect_shows_experts(tmp_path_factory, tmp_path, capsys):
    folder, _, _, _ = built("qwen2moe", tmp_path_factory)
    path = write_moe_gguf(folder, tmp_path / "q2.gguf", "qwen2moe", Q8_0)
    for model in (str(path), str(folder)):
        assert main(["inspect", model, "--json"]) == 0
        hparams = json.loads(capsys.readouterr().out)["hparams"]
        assert (hparams["expert_count"], hparams["experts_per_token"], hparams["shared_experts"]) == (8, 2, 1)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"expert_count\s+8", text) and re.search(r"shared_experts\s+1", text)
