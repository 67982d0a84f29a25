"""`agentkv bench moe` on a tiny synthetic shape without the peer: the synthetic GGUF loads as
an OLMoE model with its experts resident, the decode byte count is the active experts' share,
and the run writes the envelope with the peer reported as skipped."""

from __future__ import annotations

import json

import gguf
import pytest

from agentkv.bench.moe import decode_bytes
from agentkv.bench.moe_model import MoEShape, synthetic_moe
from agentkv.cli import main
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model

TINY = MoEShape(layers=2, d=128, heads=4, ffn=64, experts=4, top_k=2, vocab=320, context=256)


def test_synthetic_model_loads_with_experts_resident(tmp_path):
    path = synthetic_moe(TINY, "Q4_0", folder=tmp_path)
    assert synthetic_moe(TINY, "Q4_0", folder=tmp_path) == path  # cached: not rewritten
    model = load_model(open_model(path), lookup("cpu"))
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    assert set(model.expert_formats.values()) == {(q4_0, q4_0)}
    assert len(model.expert_formats) == 3 * TINY.layers
    assert not list(tmp_path.glob("*.partial-*"))


def test_decode_bytes_count_only_the_chosen_experts(tmp_path):
    path = synthetic_moe(TINY, "Q8_0", folder=tmp_path)
    facts = decode_bytes(path, TINY.top_k)
    reader = gguf.GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    dense = sum(n for name, n in sizes.items() if "_exps." not in name and name != "token_embd.weight")
    assert facts["expert_bytes"] == sum(n for name, n in sizes.items() if "_exps." in name)
    want = dense + facts["expert_bytes"] * TINY.top_k // TINY.experts + sizes["token_embd.weight"] // TINY.vocab
    assert facts["decode_bytes_per_token"] == want
    assert facts["tensor_bytes"] == sum(sizes.values())


def test_bad_shape_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="top_k=9 exceeds experts=8"):
        MoEShape(experts=8, top_k=9)
    with pytest.raises(ValueError, match="qtype must be one of"):
        synthetic_moe(TINY, "Q2_K")


def test_bench_moe_without_the_peer(tmp_path):
    shape = ["--layers", "1", "--d", "128", "--heads", "4", "--ffn", "64", "--experts", "4", "--top-k", "2"]
    rc = main(
        ["bench", "moe", *shape, "--vocab", "320", "--arms", "agentkv,llamacpp", "--prompt-len", "16"]
        + ["--decode-len", "2", "--repeats", "1", "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "moe.json").read_text())
    assert payload["benchmark"] == "moe" and payload["shape"]["experts"] == 4
    ours = payload["results"]["agentkv"]
    assert ours["prefill_tok_s"] > 0 and ours["decode_tok_s"] > 0
    assert payload["decode_ceiling_tok_s"] > 0
    peer = payload["results"]["llamacpp"]
    if "skipped" in peer:
        assert "llama_cpp" in peer["skipped"]
    else:
        assert peer["decode_tok_s"] > 0 and "vs_llamacpp" in payload["ratios"]
