"""`agentkv bench quant --w4a16`'s bookkeeping: the checkpoint's tensor bytes, the ratios to
agentkv's own Q4_0 figures and the verdicts against the targets (no timing is asserted)."""

from __future__ import annotations

import numpy as np

from agentkv.bench.quant_ckpt import w4a16_parts, write_safetensors
from agentkv.bench.quant_w4a16 import checkpoint_bytes, derive


def test_checkpoint_bytes_counts_tensor_data_not_the_header(tmp_path):
    parts, _ = w4a16_parts(np.ones((4, 64), np.float32), 32, "float32")
    written = write_safetensors(tmp_path / "model.safetensors", parts)
    assert written == 4 * 8 * 4 + 4 * 2 * 4 + 2 * 8  # packed int32, f32 scales, i64 shape
    assert checkpoint_bytes(tmp_path) == written < (tmp_path / "model.safetensors").stat().st_size


def test_derive_ratios_and_verdicts():
    mib = 2**20
    results = {
        "agentkv-q4_0": {"prefill_tok_s": 100.0, "decode_tok_s": 40.0, "weight_tensor_mib": 90.0},
        "agentkv-w4a16-f32-scales": {"prefill_tok_s": 95.0, "decode_tok_s": 30.0, "weight_tensor_mib": 120.0},
        "agentkv-w4a16-bf16-scales": {"prefill_tok_s": 92.0, "decode_tok_s": 37.0, "weight_tensor_mib": 105.0},
        "llamacpp-q4_0": {"skipped": "llama_cpp is not installed"},
    }
    sizes = {"agentkv-q4_0": 90 * mib, "agentkv-w4a16-f32-scales": 100 * mib, "agentkv-w4a16-bf16-scales": 100 * mib}
    d = derive(results, sizes)
    assert d["vs_agentkv_q4_0"]["agentkv-w4a16-bf16-scales"] == {"prefill_tok_s": 0.92, "decode_tok_s": 0.925}
    assert d["verdicts"] == {
        "agentkv-w4a16-f32-scales": {"speed": "missed", "memory": "missed"},
        "agentkv-w4a16-bf16-scales": {"speed": "met", "memory": "met"},
    }
    assert "llamacpp-q4_0" not in d["held_vs_checkpoint"]
