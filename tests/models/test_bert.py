"""BERT sentence embeddings (all-MiniLM-L6-v2) against sentence-transformers, and the encoder's
boundary errors.

Tolerance: cosine >= 0.9999 per sentence. Same float32 weights; only summation order differs
(and sentence-transformers pads a batch to its longest sentence and masks the pads, where we
run each sentence at its own length), which leaves ~1e-7 in a 384-wide unit vector."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.formats.resolve import open_model
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from tests.models.helpers import BACKENDS, cosines

MIN_COS = 0.9999
SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "agentkv reuses cached prefixes without changing an answer",
    "Short",
]


@pytest.fixture(scope="module")
def expected(minilm_path) -> tuple[list[list[int]], np.ndarray]:
    """(token ids per sentence, sentence-transformers embeddings) — both from the oracle."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_path), device="cpu")
    features = st.tokenize(SENTENCES)
    ids = [row[mask.bool()].tolist() for row, mask in zip(features["input_ids"], features["attention_mask"])]
    return ids, st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, minilm_path):
    return load_model(open_model(minilm_path), lookup(request.param))


def test_batch_matches_sentence_transformers(model, expected):
    ids, want = expected
    got = model.embed(ids)
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosines(got, want).min() >= MIN_COS
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-6)


def test_one_at_a_time_matches_batch(model, expected):
    """A sentence's embedding does not depend on what rides with it (bit-equal)."""
    ids, _ = expected
    batch = model.embed(ids)
    for i in (1, 3):  # the longest and the shortest sentence
        np.testing.assert_array_equal(model.embed([ids[i]])[0], batch[i])


def test_embedding_model_contract(model):
    assert model.is_embedding
    assert model.pooling == "mean"  # from the folder's 1_Pooling/config.json
    with pytest.raises(NotImplementedError, match="embed"):
        model.forward(np.array([101]), None, None, np.array([0]))


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "empty batch"),
        ([[101, 102], []], "sequence 1 has 0 tokens; bert takes 1..512"),
        ([[101] * 513], "sequence 0 has 513 tokens; bert takes 1..512"),
        ([[101, 30522]], "token id 30522 outside the vocabulary 0..30521"),
    ],
)
def test_bad_input_is_refused(model, bad, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        model.embed(bad)
