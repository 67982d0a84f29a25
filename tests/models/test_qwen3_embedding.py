"""Qwen3-Embedding (last-token pooling of the Qwen3 decoder) against sentence-transformers on a
tiny random model saved as its folder is (1_Pooling lasttoken + Normalize), instruction-
prefixed queries included (tests/server/test_embedding_dimensions.py covers `dimensions`).

Tolerance: 1e-5 relative (atol 1e-6 for components near 0) on unit vectors: the same float32
weights with f32 K/V, only summation order differs."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.formats.resolve import open_model
from agentkv.formats.tokenizer import load_tokenizer
from agentkv.hal.registry import lookup
from agentkv.models.registry import family_of, load_model
from tests.models import retrieval_helpers as rh

INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
TEXTS = [f"Instruct: {INSTRUCTION}\nQuery:{rh.QUERY}", *rh.DOCUMENTS]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-embedding")
    rh.qwen3(path, embedding=True, seed=2)
    return path


@pytest.fixture(scope="module")
def expected(folder) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    return np.stack([st.encode(t, convert_to_numpy=True) for t in TEXTS])  # one by one: no padding at all


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_last_token_embeddings_match_sentence_transformers(folder, expected, backend):
    source = open_model(folder)
    assert family_of(source) == "qwen3-embedding"
    model = load_model(source, lookup(backend))
    tok = load_tokenizer(source)
    ids = [tok.encode(t) for t in TEXTS]
    assert all(x[-1] == tok.token_to_id("<|endoftext|>") for x in ids)  # the pooled token
    got = model.embed(ids)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    ranks = lambda v: np.argsort(-(v[1:] @ v[0])).tolist()  # noqa: E731
    assert ranks(got) == ranks(expected)
    np.testing.assert_array_equal(model.embed([ids[2]])[0], got[2])  # batch-invariant, padding-free
