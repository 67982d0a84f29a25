"""A tiny MoE GGUF whose experts are MXFP4 (gguf-py's encoder, as llama.cpp's converter writes
gpt-oss's experts): they stay MXFP4 in memory (the load log, `expert_formats` and `inspect`
say so), the cpu backend's logits agree with the reference backend's on the same file, and,
where llama-cpp-python is installed, with llama.cpp's on the same file within FLOOR.

The cpu kernels use the MXFP4 weights' exact values (tests/hal/test_mxfp4_kernels.py), so
against the reference only the summation order differs: the f32 floor holds. llama.cpp rounds
the activations of an MXFP4 matmul to Q8_0 blocks, hence its own, measured, floor."""

from __future__ import annotations

import json
import logging

import gguf
import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.cli import main
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.witness.ops import COSINE_FLOOR_F32
from tests.models.helpers import cosines, our_logits
from tests.models.test_moe import built
from tests.models.test_moe_gguf import write_moe_gguf

MXFP4 = gguf.GGMLQuantizationType.MXFP4
# min cosine per position vs llama.cpp on the same file (llama.cpp: Q8_0-rounded activations);
# measured 0.999866 (llama-cpp-python 0.3.36, AVX-512 build), test_moe_llamacpp's Q4_0 floor
FLOOR_LLAMACPP = 0.999


@pytest.fixture(scope="module")
def mxfp4_gguf(tmp_path_factory):
    folder, _, _, ids = built("qwen3moe", tmp_path_factory)
    path = write_moe_gguf(
        folder, tmp_path_factory.mktemp("mxfp4") / "qwen3moe-mxfp4.gguf", "qwen3moe", MXFP4, vocab=True
    )
    return path, ids


def test_mxfp4_experts_stay_resident_and_match_the_reference(mxfp4_gguf, caplog, capsys):
    path, ids = mxfp4_gguf
    with caplog.at_level(logging.INFO, logger="agentkv.models.moe"):
        model = load_model(open_model(path), lookup("cpu"))
    assert set(model.expert_formats.values()) == {(MXFP4, MXFP4)} and len(model.expert_formats) == 6
    assert "6 expert tensors resident: 6 MXFP4" in caplog.text and "dequantized" not in caplog.text
    assert main(["inspect", str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["formats"]["MXFP4"]
    assert (row["num_tensors"], row["cpu_weights"]) == (6, "resident")
    cpu, ref = our_logits(path, "cpu", ids), our_logits(path, "reference", ids)
    assert cosines(cpu, ref).min() >= COSINE_FLOOR_F32
    np.testing.assert_array_equal(cpu.argmax(-1), ref.argmax(-1))


@pytest.mark.skipif(bool(peers.missing("llamacpp")), reason=f"llama-cpp-python: {peers.missing('llamacpp')}")
def test_mxfp4_logits_match_llamacpp_on_the_same_file(mxfp4_gguf):
    from tests.models.test_moe_llamacpp import NEAR_TIE, gap, llama_logits

    path, ids = mxfp4_gguf
    ours, (theirs, _) = our_logits(path, "cpu", ids), llama_logits(path, ids)
    cos = cosines(ours, theirs)
    print(f"qwen3moe MXFP4: min cosine vs llama.cpp {cos.min():.6f} (floor {FLOOR_LLAMACPP})")
    assert cos.min() >= FLOOR_LLAMACPP, f"cosines {cos}"
    clear = [i for i in range(len(ids)) if gap(ours[i]) > NEAR_TIE]
    np.testing.assert_array_equal(ours[clear].argmax(-1), theirs[clear].argmax(-1))
