"""`agentkv bench mla` on a tiny shape of DeepSeek-V2-Lite's layout: the synthetic GGUF has the
names llama.cpp's converter writes for a `deepseek2` file (checked against the converter's own
output where its source is here), loads in agentkv with the latent KV layout and its experts
resident, and the run writes the envelope with every figure (llama-server's arm where the
binary is built, otherwise reported as skipped)."""

from __future__ import annotations

import json

import gguf
import pytest

from agentkv.bench.llama_server import server_missing
from agentkv.bench.mla_model import V2LiteShape, synthetic_v2lite
from agentkv.cli import main
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model

# 27 layers: llama.cpp reads a deepseek2 file without a low-rank q only at V2-Lite's depth
TINY = dict(layers=27, d=256, heads=4, kv_rank=64, ffn=64, dense_ffn=256, experts=8, top_k=2, vocab=400)
ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


def test_synthetic_v2lite_loads_with_a_latent_cache(tmp_path):
    shape = V2LiteShape(**TINY)
    path = synthetic_v2lite(shape, folder=tmp_path)
    assert synthetic_v2lite(shape, folder=tmp_path) == path  # cached: not rewritten
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == "Q4_K" and types["blk.1.ffn_down_exps.weight"] == "Q5_0"
    assert "blk.0.ffn_gate.weight" in types and "blk.0.ffn_gate_inp.weight" not in types  # layer 0 dense
    model = load_model(open_model(path), lookup("cpu"))
    spec = model.kv_spec(4, 16)
    assert spec.latent and spec.num_kv_heads * spec.head_dim == TINY["kv_rank"] + 64
    assert len(model.expert_formats) == 3 * (TINY["layers"] - 1)
    assert not list(tmp_path.glob("*.partial-*"))


def test_bad_shape_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="V2LiteShape.experts must be > 0, got 0"):
        V2LiteShape(experts=0)


def test_bench_mla_writes_every_figure(tmp_path):
    rc = main(
        ["bench", "mla", *ARGS, "--prompt-len", "32", "--decode-len", "2", "--long-len", "64"]
        + ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "mla.json").read_text())
    ours = payload["results"]["agentkv"]
    for key in ("prefill_tok_s", "decode_tok_s", "long_prefill_tok_s", "long_decode_tok_s", "first_prefill_s"):
        assert ours[key] > 0, key
    assert ours["kv_bytes_per_token"] == 27 * (64 + 64) * {"f16": 2, "f32": 4}[ours["kv_dtype"]]
    peer = payload["results"]["llama-server"]
    if server_missing():
        assert peer.get("skipped"), peer
    else:
        assert peer["decode_tok_s"] > 0 and peer["kv_bytes_per_token"] > 0
        assert set(payload["ratios"]["vs_llama_server"]) == {"prefill_tok_s", "decode_tok_s", "long_decode_tok_s"}
    assert "| agentkv |" in (tmp_path / "mla.md").read_text()
