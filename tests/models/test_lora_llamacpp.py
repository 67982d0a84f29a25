"""A llama.cpp LoRA adapter made by llama.cpp's own converter (`convert_lora_to_gguf.py`, run
in a subprocess with its gguf-py, the base given as a local HF folder) on a GGUF base:
agentkv's logits with it match llama-cpp-python's with the same file applied (`lora_path`)
within FLOOR, and greedy continuations agree or first differ at a near-tie.

The floor is not exactness: llama.cpp's f32 matmuls and its LoRA (`W x + s * B (A x)`, as
ggml graphs) sum in other orders than agentkv's. The control: the adapter moves llama.cpp's
own logits far below the floor, so a converter file that agentkv misread (scaling, q/k row
permutation, A/B swap) could not pass."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.formats.lora import read_adapter
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.adapters import attach
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import cosines, prompt, tiny_hf_model, write_gguf
from tests.models.llamacpp_convert import SRC, source_missing
from tests.models.test_lora import ALL, peft_adapter

REASON = peers.missing("llamacpp")
if REASON:
    pytest.skip(f"llama-cpp-python comparison skipped: {REASON}", allow_module_level=True)

CONVERTER = SRC / "convert_lora_to_gguf.py"
# min cosine per position vs llama.cpp with the adapter applied; measured 0.9999912
# (llama-cpp-python 0.3.36, this tiny llama, all 7 projections, r=4); without the adapter
# llama.cpp's own logits sit at cosine -0.19 to these
FLOOR = 0.99995
NEAR_TIE = 0.05
CONTINUE = 6


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(base GGUF, the converter's adapter GGUF, prompt)."""
    reason = source_missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lora_llamacpp")
    hf = tiny_hf_model(root / "base", "llama", seed=3, vocab_size=257)
    base = write_gguf(hf, root / "base.gguf", "llama", byte_vocab=True)
    peft_adapter(root / "base", root / "adapter", 1, r=4, lora_alpha=6, use_rslora=False, target_modules=ALL)
    out = root / "adapter.gguf"
    env = {**os.environ, "PYTHONPATH": str(SRC / "gguf-py")}
    command = [sys.executable, str(CONVERTER), "--base", str(root / "base"), "--outfile", str(out), "--outtype", "f32"]
    done = subprocess.run([*command, str(root / "adapter")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return base, out, prompt(12, vocab=257, seed=4)


def llama(base: Path, adapter: Path | None):
    from llama_cpp import Llama

    extra = {} if adapter is None else {"lora_path": str(adapter)}
    return Llama(model_path=str(base), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False, **extra)


def gap(row: np.ndarray) -> float:
    top = np.sort(row.astype(np.float64))[-2:]
    return float(top[1] - top[0])


def test_converter_adapter_matches_llamacpp(converted):
    base, path, ids = converted
    model = load_model(open_model(base), lookup("cpu"))
    adapter = attach(model, read_adapter(path), "g")

    def ours(seq: list[int]) -> np.ndarray:
        blocks = math.ceil(len(seq) / 4)
        return ModelRunner(model, blocks, 4).run([Chunk(seq, 0, list(range(blocks)), "all", adapter)])

    llm = llama(base, path)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    mine = ours(ids)
    cos = cosines(mine, theirs)
    plain = llama(base, None)
    plain.eval(ids)
    control = cosines(np.array(plain.scores[: len(ids)], dtype=np.float32), theirs)
    print(f"GGUF adapter: min cosine vs llama.cpp {cos.min():.7f} (floor {FLOOR}); base vs adapter {control.min():.4f}")
    assert cos.min() >= FLOOR, cos
    assert control.min() < FLOOR  # the adapter moves llama.cpp's own logits past the floor
    clear = [i for i in range(len(ids)) if gap(mine[i]) > NEAR_TIE]
    np.testing.assert_array_equal(mine[clear].argmax(-1), theirs[clear].argmax(-1))
    seq_ours, seq_theirs = list(ids), list(ids)
    for step in range(CONTINUE):
        row = ours(seq_ours)[-1]
        seq_ours.append(int(row.argmax()))
        seq_theirs.append(int(np.argmax(llm.scores[len(seq_theirs) - 1])))
        if seq_ours[-1] != seq_theirs[-1]:
            print(f"GGUF adapter: greedy continuations first differ at step {step}, top-2 gap {gap(row):.4f}")
            assert gap(row) < NEAR_TIE, f"differ at step {step} with a clear gap {gap(row):.4f}"
            break
        llm.eval([seq_theirs[-1]])
