"""SafetensorsSource against tiny folders written by transformers' save_pretrained."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from agentkv.formats.errors import SafetensorsError
from agentkv.formats.resolve import resolve_model_path
from agentkv.formats.safetensors import SafetensorsSource
from agentkv.models.bert import BertConfig
from agentkv.models.config import SourceKeys
from agentkv.models.gemma3 import Gemma3Config
from agentkv.models.llama import LlamaConfig

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=96,
    max_position_embeddings=256,
)


def _save(folder: Path, model_type: str, dtype: torch.dtype = torch.float32, **kwargs) -> dict:
    """Write a tiny random model; returns its state dict (HF names -> torch tensors)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **TINY)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.save_pretrained(folder, **kwargs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("llama")
    return folder, _save(folder, "llama")


def _check_tensors(source: SafetensorsSource, state: dict, qtype: Q) -> None:
    on_disk = {source.hf_name(n): n for n in source.tensor_names()}
    for hf_name, expected in state.items():
        if hf_name not in on_disk:  # tied lm_head is not saved
            assert hf_name == "lm_head.weight"
            continue
        info = source.tensor(on_disk[hf_name])
        assert info.shape == tuple(expected.shape) and info.qtype == int(qtype)
        if qtype == Q.BF16:
            assert np.array_equal(info.data, expected.view(torch.int16).numpy().view(np.uint16))
        else:
            assert np.array_equal(info.data, expected.numpy())


def test_llama_names_map_to_gguf_and_values_equal(llama) -> None:
    folder, state = llama
    source = SafetensorsSource(folder)
    names = set(source.tensor_names())
    assert {
        "token_embd.weight",
        "output.weight",
        "output_norm.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_k.weight",
        "blk.1.ffn_down.weight",
        "blk.0.ffn_norm.weight",
    } <= names
    assert source.hf_name("blk.1.attn_output.weight") == "model.layers.1.self_attn.o_proj.weight"
    assert len(names) == len(state)
    _check_tensors(source, state, Q.F32)
    assert isinstance(source.tensor("token_embd.weight").data, np.memmap)
    assert source.kind == "safetensors"


def test_llama_hparams(llama) -> None:
    hp = SafetensorsSource(llama[0]).hparams
    assert (hp.arch, hp.vocab_size, hp.hidden_size, hp.intermediate_size) == ("llama", 96, 32, 64)
    assert (hp.num_layers, hp.num_heads, hp.num_kv_heads, hp.head_dim) == (2, 4, 2, 8)
    assert (hp.context_len, hp.norm_eps, hp.rope_theta) == (256, 1e-6, 10000.0)
    assert (hp.tie_embeddings, hp.rope_scaling) == (False, None)
    assert LlamaConfig.from_source(SafetensorsSource(llama[0])).sliding_window is None


def test_qwen2_biases_and_tied_embeddings(tmp_path: Path) -> None:
    state = _save(tmp_path, "qwen2")
    source = SafetensorsSource(tmp_path)
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.1.attn_v.bias"} <= set(source.tensor_names())
    _check_tensors(source, state, Q.F32)
    hp = source.hparams
    assert (hp.arch, hp.tie_embeddings) == ("qwen2", False)  # Qwen2Config unties by default
    assert "output.weight" in source.tensor_names()


def test_sharded_folder(tmp_path: Path) -> None:
    state = _save(tmp_path, "llama", max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _check_tensors(SafetensorsSource(tmp_path), state, Q.F32)


def test_bf16_folder(tmp_path: Path) -> None:
    state = _save(tmp_path, "llama", dtype=torch.bfloat16)
    source = SafetensorsSource(tmp_path)
    _check_tensors(source, state, Q.BF16)
    assert source.tensor("blk.0.attn_q.weight").data.dtype == np.uint16


def test_tokenizer_config_merged_into_metadata(llama, tmp_path: Path) -> None:
    folder, _ = llama
    assert "tokenizer_config" not in SafetensorsSource(folder).metadata
    minilm = SafetensorsSource(resolve_model_path("minilm"))
    assert minilm.metadata["model_type"] == "bert"
    assert minilm.metadata["tokenizer_config"]["do_lower_case"] is True


def test_minilm_bert_names_and_pooling() -> None:
    source = SafetensorsSource(resolve_model_path("minilm"))
    hp = source.hparams
    assert (hp.arch, hp.vocab_size, hp.hidden_size, hp.num_layers, hp.num_heads) == ("bert", 30522, 384, 6, 12)
    assert (BertConfig.from_source(source).pooling, hp.norm_eps, hp.context_len) == ("mean", 1e-12, 512)
    assert source.tensor("token_embd.weight").shape == (30522, 384)
    assert source.tensor("blk.5.layer_output_norm.bias").shape == (384,)
    assert source.tensor("embeddings.position_ids").qtype == int(Q.I64)  # unmapped: HF name kept


def test_gemma3_config_hparams(tmp_path: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma3_text", **{**TINY, "num_hidden_layers": 7}, head_dim=8)
    config.save_pretrained(tmp_path)
    from agentkv.formats.hparams import hparams_from_config

    hp = hparams_from_config(json.loads((tmp_path / "config.json").read_text()), tmp_path)
    cfg = Gemma3Config.from_keys(SourceKeys(hp, "safetensors", tmp_path))
    assert hp.arch == "gemma3" and cfg.sliding_window == 4096
    assert cfg.sliding_window_layers == (True,) * 5 + (False, True)
    assert (hp.rope_theta, cfg.rope_theta_local, cfg.query_pre_attn_scalar) == (1e6, 1e4, 256.0)


# ------------------------------------------------------------------ malformed folders


def _raises(folder: Path, *needles: str) -> None:
    with pytest.raises(SafetensorsError) as excinfo:
        SafetensorsSource(folder).hparams
    for needle in needles:
        assert needle in str(excinfo.value)


def _tiny_file(folder: Path, header: dict, data: bytes) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **TINY, "rms_norm_eps": 1e-6}))
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_missing_folder_and_config(tmp_path: Path) -> None:
    _raises(tmp_path / "nope", "nope", "no such model folder")
    _raises(tmp_path, "config.json")


def test_index_references_missing_shard(tmp_path: Path) -> None:
    _save(tmp_path, "llama", max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / shard).unlink()
    _raises(tmp_path, "model.safetensors.index.json", shard, "missing")


def test_truncated_file(tmp_path: Path) -> None:
    _tiny_file(tmp_path, {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, bytes(60))
    _raises(tmp_path, "model.safetensors", "truncated file", "'w'")


def test_truncated_header(tmp_path: Path) -> None:
    _tiny_file(tmp_path, {}, b"")
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    _raises(tmp_path, "model.safetensors", "truncated header", "1000")


def test_bytes_disagree_with_shape(tmp_path: Path) -> None:
    _tiny_file(tmp_path, {"model.norm.weight": {"dtype": "F16", "shape": [32], "data_offsets": [0, 32]}}, bytes(32))
    _raises(tmp_path, "model.safetensors", "'model.norm.weight'", "needs 64 bytes", "hold 32")


def test_missing_hparam_key(tmp_path: Path) -> None:
    _tiny_file(tmp_path, {}, b"")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _raises(tmp_path, str(tmp_path), "'hidden_size'")


def test_scalar_tensor_is_mapped(tmp_path: Path) -> None:
    value = np.array(2.5, dtype=np.float32)
    _tiny_file(tmp_path, {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, value.tobytes())
    info = SafetensorsSource(tmp_path).tensor("s")
    assert info.shape == () and float(info.data) == 2.5


def test_bf16_dequantizes_to_the_torch_values(tmp_path: Path) -> None:
    state = _save(tmp_path, "llama", dtype=torch.bfloat16)
    source = SafetensorsSource(tmp_path)
    got = source.dequantized("blk.0.ffn_up.weight")
    assert np.array_equal(got, state["model.layers.0.mlp.up_proj.weight"].float().numpy())


def test_config_rope_scaling_old_and_new_styles(tmp_path: Path) -> None:
    from agentkv.formats.hparams import hparams_from_config

    base = {"model_type": "llama", **TINY, "rms_norm_eps": 1e-5}
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    old = hparams_from_config({**base, "rope_theta": 5e5, "rope_scaling": llama3}, tmp_path)
    new = hparams_from_config({**base, "rope_parameters": {"rope_theta": 5e5, **llama3}}, tmp_path)
    for hp in (old, new):
        assert hp.rope_theta == 5e5
        assert hp.rope_scaling == {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    mistral = hparams_from_config({**base, "model_type": "mistral", "sliding_window": 64}, tmp_path)
    cfg = LlamaConfig.from_keys(SourceKeys(mistral, "safetensors", tmp_path))
    assert (mistral.arch, cfg.sliding_window, cfg.sliding_window_layers) == ("llama", 64, (True, True))
