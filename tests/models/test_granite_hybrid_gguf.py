"""Tiny Granite-4.0-H models converted by llama.cpp's own converter (arch `granitehybrid`: the
experts' and shared MLP's gate|up split, A stored as -exp(A_log), dt_bias as `ssm_dt.bias`, the
Mamba layers marked by zero K/V heads): agentkv loads the GGUFs and matches transformers on the
HF folders they came from, and llama-cpp-python on the same files (skipped without it).

llama.cpp runs a Granite hybrid's attention without rope whatever the config says (the file's
`rope.scaling.finetuned` is false), so both variants here are NoPE, as Granite-4.0-H is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentkv.bench import peers
from agentkv.formats.resolve import open_model
from agentkv.models.granite_hybrid import GraniteHybridConfig
from tests.models.helpers import assert_logits_match, cosines, hf_logits, our_logits, prompt
from tests.models.llamacpp_convert import convert_all, source_missing
from tests.models.test_granite_hybrid import DENSE, MIN_COS, tiny_granite
from tests.models.test_hybrid_gguf import VOCAB, bpe_tokenizer

if source_missing():
    pytest.skip(source_missing(), allow_module_level=True)

VARIANTS = {"moe": {}, "dense": DENSE}
# min cosine per position, agentkv vs llama-cpp-python on the same f32 GGUF: both run f32
# recurrences, summed in other orders (llama.cpp: its SSD scan). Measured (llama-cpp-python
# 0.3.36): 1 - cos = 1.2e-8 (moe), 2.2e-8 (dense), every argmax equal.
FLOOR = 0.99999


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """variant -> (GGUF path, HF logits of the prompt, the prompt), converted in one run. The
    config names layers as the hub's Granite-4.0-H does ("mamba", "attention"): the converter
    does not know transformers 5's "linear_attention" / "full_attention"."""
    root = tmp_path_factory.mktemp("granite-gguf")
    ids = prompt(40, vocab=VOCAB)
    built, pairs = {}, []
    for name, overrides in VARIANTS.items():
        folder = root / name
        folder.mkdir()
        model = tiny_granite(folder, seed=11, vocab_size=VOCAB, **overrides)
        bpe_tokenizer(folder)
        config = json.loads((folder / "config.json").read_text())
        config["layer_types"] = ["mamba" if t == "linear_attention" else "attention" for t in config["layer_types"]]
        (folder / "config.json").write_text(json.dumps(config))
        built[name] = (root / f"{name}.gguf", hf_logits(model, ids), ids)
        pairs.append((folder, root / f"{name}.gguf"))
    convert_all(pairs)  # Granite refuses --no-mtp
    return built


@pytest.mark.parametrize("variant", VARIANTS)
def test_converted_gguf_config(converted, variant):
    cfg = GraniteHybridConfig.from_source(open_model(converted[variant][0]))
    assert cfg.recurrent_layers == (True, False, True, True) and not cfg.rope
    assert (cfg.mamba.num_heads, cfg.mamba.head_dim, cfg.mamba.num_groups, cfg.mamba.state_size) == (8, 16, 2, 16)
    assert cfg.multipliers == pytest.approx((12.0, 0.25, 0.22, 6.0)) and cfg.num_experts == (
        4 if variant == "moe" else 0
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_converted_gguf_matches_transformers(converted, variant):
    path, theirs, ids = converted[variant]
    assert_logits_match(our_logits(path, "cpu", ids), theirs, MIN_COS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_converted_gguf_matches_llama_cpp(converted, variant):
    reason = peers.missing("llamacpp")
    if reason:
        pytest.skip(f"llama-cpp-python comparison skipped: {reason}")
    from llama_cpp import Llama

    path, _, ids = converted[variant]
    llm = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    ours = our_logits(path, "cpu", ids)
    cos = cosines(ours, theirs)
    assert cos.min() >= FLOOR, f"{variant}: min cosine {cos.min():.7f} vs llama.cpp (per row: {cos})"
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))
