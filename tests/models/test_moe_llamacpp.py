"""The tiny MoE models of test_moe.py as GGUFs (llama.cpp's tensor names and metadata, see
test_moe_gguf.py) with Q8_0 and Q4_0 experts: agentkv's logits match llama-cpp-python's on the
same file within FLOOR, and greedy continuations agree or first differ at a near-tie.

The floor is not exactness: llama.cpp quantizes the activations of a quantized matmul to 8 bits
(Q8_0 blocks) where agentkv keeps them f32, and its f32 matmuls sum in another order. Argmax is
compared where agentkv's top-2 logits are more than NEAR_TIE apart; a greedy continuation may
first differ only at such a near-tie, and the test reports the step and the gap.

OLMoE runs as an MHA variant of the tiny model (kv heads = heads, as OLMoE itself is): llama.cpp
sizes OLMoE's k norm by the embedding width, so it refuses the GQA test model's k norm."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.runner import Chunk, ModelRunner
from tests.models.helpers import (
    cosines,
    hf_logits,
    prompt,
    tiny_hf_model,
)
from tests.models.test_moe import FAMILIES, MOE, PROMPT_LEN, ROUTER_MARGIN, built, router_margin
from tests.models.test_moe_gguf import GGUF_ARCH, write_moe_gguf

REASON = peers.missing("llamacpp")
if REASON:
    pytest.skip(f"llama-cpp-python comparison skipped: {REASON}", allow_module_level=True)

QTYPES = {"Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_0": gguf.GGMLQuantizationType.Q4_0}
# min cosine per position vs llama.cpp on the same file; measured (llama-cpp-python 0.3.36,
# AVX-512 build): 0.99966 (qwen3moe Q8_0) .. 0.99996, every family and both types
FLOOR = {"Q8_0": 0.999, "Q4_0": 0.999}
NEAR_TIE = 0.05  # top-2 logit gap (agentkv's) below which the two engines may pick differently
CONTINUE = 8


def model_folder(name: str, tmp_path_factory):
    """(folder, prompt) of the family's tiny model; for olmoe its MHA variant, seeded so that
    its routers clear the same top-k margin as test_moe.py's models."""
    if name != "olmoe":
        folder, _, _, ids = built(name, tmp_path_factory)
        return folder, ids
    spec = {**MOE, **FAMILIES["olmoe"], "num_key_value_heads": 4}
    model_type = spec.pop("model_type")
    ids = prompt(PROMPT_LEN)
    for seed in range(10):
        folder = tmp_path_factory.mktemp(f"olmoe-mha-{seed}")
        model = tiny_hf_model(folder, model_type, seed=seed, **spec)
        hf_logits(model, ids)
        if router_margin(model, ids) > ROUTER_MARGIN:
            return folder, ids
    raise AssertionError("no seed in 0..9 gives the MHA olmoe model a clear router margin")


def llama_logits(path, ids: list[int]):
    """llama-cpp-python's logits `[len, vocab]` for `ids`, and a greedy continuation function."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32), llm


def ours_runner(path):
    model = load_model(open_model(path), lookup("cpu"))

    def logits(ids: list[int]) -> np.ndarray:
        blocks = math.ceil(len(ids) / 4)
        return ModelRunner(model, blocks, 4).run([Chunk(ids, 0, list(range(blocks)), "all")])

    return logits


def gap(row: np.ndarray) -> float:
    top = np.sort(row.astype(np.float64))[-2:]
    return float(top[1] - top[0])


@pytest.mark.parametrize("qtype", sorted(QTYPES))
@pytest.mark.parametrize("name", sorted(GGUF_ARCH))
def test_logits_match_llamacpp_on_the_same_file(name, qtype, tmp_path_factory, tmp_path):
    folder, ids = model_folder(name, tmp_path_factory)
    path = write_moe_gguf(folder, tmp_path / f"{name}-{qtype}.gguf", GGUF_ARCH[name], QTYPES[qtype], vocab=True)
    logits = ours_runner(path)
    ours = logits(ids)
    theirs, llm = llama_logits(path, ids)
    cos = cosines(ours, theirs)
    print(f"{name} {qtype}: min cosine vs llama.cpp {cos.min():.6f} (floor {FLOOR[qtype]})")
    assert cos.min() >= FLOOR[qtype], f"{name} {qtype}: cosines {cos}"
    clear = [i for i in range(len(ids)) if gap(ours[i]) > NEAR_TIE]
    np.testing.assert_array_equal(ours[clear].argmax(-1), theirs[clear].argmax(-1))

    seq_ours, seq_theirs = list(ids), list(ids)
    for step in range(CONTINUE):
        row = logits(seq_ours)[-1]
        seq_ours.append(int(row.argmax()))
        seq_theirs.append(int(np.argmax(llm.scores[len(seq_theirs) - 1])))
        if seq_ours[-1] != seq_theirs[-1]:
            print(f"{name} {qtype}: greedy continuations first differ at step {step}, top-2 gap {gap(row):.4f}")
            assert gap(row) < NEAR_TIE, f"{name} {qtype}: differ at step {step} with a clear gap {gap(row):.4f}"
            break
        llm.eval([seq_theirs[-1]])
