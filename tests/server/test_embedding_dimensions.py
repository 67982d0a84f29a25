"""`dimensions` on /v1/embeddings through the openai client: a Matryoshka model (Qwen3-Embedding,
tiny and random here) returns its embeddings cut to that many components and renormalised;
a size it cannot give is the API's 400. The oracle is sentence-transformers' full vector."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.server.app import create_app
from tests.models import retrieval_helpers as rh
from tests.server.conftest import make_client, serve

TEXTS = rh.DOCUMENTS[:2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-embedding")
    rh.qwen3(folder, embedding=True, seed=2)
    engine = AsyncEngine.from_model(str(folder), kv_cache_dtype="f32")
    for live in serve(create_app(engine, served_model_name="qe"), engine):
        yield live, folder


def test_dimensions_cut_and_renormalise(server):
    from sentence_transformers import SentenceTransformer

    live, folder = server
    full = SentenceTransformer(str(folder), device="cpu").encode(TEXTS[0], convert_to_numpy=True)
    client = make_client(live)
    got = client.embeddings.create(model="qe", input=TEXTS[0], dimensions=16, encoding_format="float").data[0].embedding
    np.testing.assert_allclose(got, full[:16] / np.linalg.norm(full[:16]), rtol=1e-5, atol=1e-6)
    whole = client.embeddings.create(model="qe", input=TEXTS, encoding_format="float").data
    assert [len(d.embedding) for d in whole] == [64, 64]
    np.testing.assert_allclose(whole[0].embedding, full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [0, 65])
def test_a_size_the_model_cannot_give_is_a_400(server, bad):
    with pytest.raises(openai.BadRequestError, match=f"dimensions={bad} is not supported"):
        make_client(server[0]).embeddings.create(model="qe", input="x", dimensions=bad)
