"""`agentkv bench hybrid` on a tiny shape of Qwen3.5's layout: the synthetic GGUF has the names and
metadata llama.cpp's converter writes for a `qwen35` file, loads in agentkv as a hybrid with its
recurrent state and its weights resident, and the run writes the envelope with every figure,
the second turn and the agent replay (llama-server's arms where the binary is built, otherwise
reported as skipped)."""

from __future__ import annotations

import json

import gguf
import pytest

from agentkv.bench.hybrid_model import Qwen3Shape, Qwen35Shape, synthetic_qwen3, synthetic_qwen35
from agentkv.bench.llama_server import server_missing
from agentkv.cli import main
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model

TINY = dict(layers=4, d=256, ffn=256, heads=2, kv_heads=1, head_dim=128, rope_dim=32)
TINY |= dict(linear_k_heads=2, linear_v_heads=2, linear_dim=128, vocab=400)
ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]


def test_synthetic_qwen35_loads_as_a_hybrid(tmp_path):
    shape = Qwen35Shape(**TINY)
    path = synthetic_qwen35(shape, folder=tmp_path)
    assert synthetic_qwen35(shape, folder=tmp_path) == path  # cached: not rewritten
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_qkv.weight"] == "Q4_K" and types["blk.0.ffn_down.weight"] == "Q6_K"
    assert "blk.3.attn_q.weight" in types and "blk.3.ssm_a" not in types  # every 4th layer attends
    assert "output.weight" not in types  # the head is the embedding
    model = load_model(open_model(path), lookup("cpu"))
    assert model.config.recurrent_layers == (True, True, True, False)
    assert model.state_bytes == 3 * 4 * (3 * 3 * 256 + 2 * 128 * 128)
    dense = synthetic_qwen3(Qwen3Shape(2, 256, 256, 2, 1, 128, 400), folder=tmp_path)
    assert load_model(open_model(dense), lookup("cpu")).hparams.arch == "qwen3"


def test_bad_shape_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="Qwen35Shape.linear_dim must be > 0, got 0"):
        Qwen35Shape(linear_dim=0)


def test_bench_hybrid_writes_every_figure(tmp_path):
    replay = ["--replay-agents", "2", "--replay-turns", "2", "--replay-prefix", "64"]
    rc = main(
        ["bench", "hybrid", *ARGS, "--prompt-len", "32", "--decode-len", "2", "--long-len", "80", *replay]
        + ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "hybrid.json").read_text())
    ours = payload["results"]["agentkv"]
    for key in ("prefill_tok_s", "decode_tok_s", "long_decode_tok_s", "turn2_ttft_s"):
        assert ours[key] > 0, key
    assert ours["turn2_prompt_tokens"] == 80 + 32 + 64
    assert 80 <= ours["turn2_cached_tokens"] < ours["turn2_prompt_tokens"]  # resumed past the transcript
    for model in ("hybrid", "dense"):
        mine = payload["replay"][model]["agentkv"]
        assert mine["prompt_tokens"] > mine["computed_tokens"] > 0 and 0 < mine["hit_rate"] < 1, mine
        peer = payload["replay"][model]["llama-server"]
        assert peer.get("skipped") if server_missing() else peer["computed_tokens"] > 0, peer
    peer = payload["results"]["llama-server"]
    assert peer.get("skipped") if server_missing() else peer["decode_tok_s"] > 0, peer
    assert (tmp_path / "hybrid.md").read_text().count("Agent replay") == 1
