"""The tiny hybrids converted by llama.cpp's own converter (`qwen3next`, and `qwen35` and `qwen35moe`, whose
value heads the converter reorders to tiled order): agentkv loads the GGUFs and matches
transformers on the HF folders they came from; once llama-cpp-python is installed, its logits
on the same files agree within FLOOR (skipped cleanly without it)."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.bench import peers
from tests.models.helpers import assert_logits_match, cosines, hf_logits, our_logits, prompt
from tests.models.llamacpp_convert import convert_all, source_missing
from tests.models.test_hybrid import MIN_COS, tiny_hybrid

if source_missing():
    pytest.skip(source_missing(), allow_module_level=True)

VOCAB = 272  # the byte-level tokenizer's 256 ids and room for the converter's specials
FAMILIES = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}
# min cosine per position, agentkv vs llama-cpp-python on the same f32 GGUF: both recurrences
# are f32 but sum in other orders (llama.cpp: its chunked delta rule on a prompt). Measured
# (llama-cpp-python 0.3.36): 1 - cos = 1.1e-8 (qwen3next), 1.7e-9 (qwen35), 1.3e-8 (qwen35moe),
# every argmax equal.
FLOOR = 0.99999
# Qwen3.5's rope is multimodal (sections of the rotated pairs for t, h, w; for text all three
# are the token's position, so it is plain rope); llama.cpp asserts the sections fit the
# rotated dims, 16 * 0.25 / 2 = 2 pairs here, where the default [11, 11, 10] would not.
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}
ROPE = {"qwen35": {"rope_parameters": MROPE}, "qwen35moe": {"rope_parameters": MROPE}}


def bpe_tokenizer(folder) -> None:
    """A byte-level BPE tokenizer.json with one merge (llama.cpp refuses a BPE vocab without
    merges): the 256 byte symbols and "Ġt"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab={**vocab, "Ġt": len(vocab)}, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """arch -> (GGUF path, HF logits of the prompt, the prompt), both families converted in
    one converter run."""
    root = tmp_path_factory.mktemp("hybrid-gguf")
    ids = prompt(40, vocab=VOCAB)
    built, pairs = {}, []
    for arch, model_type in FAMILIES.items():
        folder = root / model_type
        folder.mkdir()
        model = tiny_hybrid(folder, model_type, seed=11, vocab_size=VOCAB, **ROPE.get(arch, {}))
        bpe_tokenizer(folder)
        built[arch] = (root / f"{arch}.gguf", hf_logits(model, ids), ids)
        pairs.append((folder, root / f"{arch}.gguf"))
    convert_all(pairs, flags=("--no-mtp",))  # the Qwen hybrids' multi-token-prediction layers left out
    return built


@pytest.mark.parametrize("arch", FAMILIES)
def test_converted_gguf_matches_transformers(converted, arch):
    path, theirs, ids = converted[arch]
    assert_logits_match(our_logits(path, "cpu", ids), theirs, MIN_COS)


@pytest.mark.parametrize("arch", FAMILIES)
def test_converted_gguf_matches_llama_cpp(converted, arch):
    reason = peers.missing("llamacpp")
    if reason:
        pytest.skip(f"llama-cpp-python comparison skipped: {reason}")
    from llama_cpp import Llama

    path, _, ids = converted[arch]
    llm = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    ours = our_logits(path, "cpu", ids)
    cos = cosines(ours, theirs)
    assert cos.min() >= FLOOR, f"{arch}: min cosine {cos.min():.7f} vs llama.cpp (per row: {cos})"
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))
