"""The tiny gpt-oss with MXFP4 experts, converted to GGUF by llama.cpp's own
`convert_hf_to_gguf.py` (tests/models/llamacpp_convert.py): agentkv loads it (arch `gpt-oss`,
experts MXFP4 in the file) and its logits match transformers'; with llama-cpp-python installed
they match llama.cpp's on the same file within FLOOR, and greedy continuations agree or first
differ at a near-tie (reported).

llama.cpp rounds YaRN's correction range to whole dims (ggml's rope_yarn_corr_dims) where
gpt-oss's HF config says `truncate: false`; agentkv follows each file's convention, so the
transformers side here is built with `truncate: true` to be the same model as the GGUF. (With
head_dim 16 the two conventions differ by far more than any floor: cosine ~0.45.)"""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.formats.resolve import open_model
from tests.models.gpt_oss_tiny import VOCAB, harmony_tokenizer, tiny_gpt_oss_mxfp4
from tests.models.helpers import assert_logits_match, cosines, hf_logits, our_logits, prompt
from tests.models.llamacpp_convert import convert, source_missing

if source_missing():
    pytest.skip(source_missing(), allow_module_level=True)

MXFP4 = 39  # gguf.GGMLQuantizationType.MXFP4
PROMPT = prompt(40, vocab=256, seed=7)
MIN_COS = 0.99999  # agentkv on the GGUF vs transformers on the same weights (measured 1 - 7e-12)
# agentkv vs llama.cpp on the same file: llama.cpp rounds activations to 8 bits for its MXFP4
# matmuls and sums f32 in another order. Measured (llama-cpp-python 0.3.36, AVX-512 build): 39
# of 40 rows 0.99966 .. 0.99998; row 15 0.99619, a token whose router margin (2nd chosen vs
# 1st unchosen expert logit) is 0.023, where 8-bit activations can pick another expert.
FLOOR = 0.995
NEAR_TIE = 0.05
CONTINUE = 4


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    model = tiny_gpt_oss_mxfp4(folder, vocab_size=VOCAB, truncate=True)
    harmony_tokenizer(folder)
    path = convert(folder, tmp_path_factory.mktemp("gguf") / "tiny-gpt-oss.gguf")
    return path, hf_logits(model, PROMPT)


def test_the_converted_file_loads_and_matches_transformers(converted):
    path, theirs = converted
    source = open_model(path)
    assert source.hparams.arch == "gpt-oss"
    assert {source.tensor(f"blk.0.ffn_{p}_exps.weight").qtype for p in ("gate", "up", "down")} == {MXFP4}
    for backend in ("reference", "cpu"):
        assert_logits_match(our_logits(path, backend, PROMPT), theirs, MIN_COS)


@pytest.mark.skipif(bool(peers.missing("llamacpp")), reason=f"llama-cpp-python: {peers.missing('llamacpp')}")
def test_matches_llama_cpp_on_the_same_file(converted):
    from llama_cpp import Llama

    path, _ = converted
    llm = Llama(model_path=str(path), n_ctx=128, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(PROMPT)
    theirs = np.array(llm.scores[: len(PROMPT)], dtype=np.float32)
    ours = our_logits(path, "cpu", PROMPT)
    cos = cosines(ours, theirs)
    print(f"gpt-oss MXFP4 vs llama.cpp: min cosine {cos.min():.6f}")
    assert cos.min() >= FLOOR
    top2 = np.sort(ours, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > NEAR_TIE
    assert np.array_equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])
    ids, theirs_ids = list(PROMPT), []
    llm.reset()
    for tok in llm.generate(PROMPT, temp=0.0):
        theirs_ids.append(int(tok))
        if len(theirs_ids) == CONTINUE:
            break
    for step, want in enumerate(theirs_ids):
        row = our_logits(path, "cpu", ids, rows="last")[0]
        got = int(row.argmax())
        if got != want:
            gap = float(np.sort(row)[-1] - np.sort(row)[-2])
            print(f"greedy continuations first differ at step {step}: top-2 gap {gap:.4f}")
            assert gap < NEAR_TIE
            break
        ids.append(got)
