"""/v1/rerank, /score and /classify over real HTTP: Cohere's own client (and LangChain's
CohereRerank) against a BERT cross-encoder, plain httpx against /score, a Qwen3-style causal
reranker whose shared query is prefilled once (and whose scores are bit-identical to each pair
scored cold, in another tenant's namespace), and the API's 4xx for bad bodies.

Oracles: sentence-transformers' CrossEncoder and transformers' causal LM run as the
Qwen3-Reranker model card does. Tolerance: 1e-5 relative on scores in (0, 1); the same
float32 weights, only the summation order differs (~1e-7 seen)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch

from agentkv.formats.resolve import resolve_model_path
from agentkv.runtime.async_engine import AsyncEngine
from agentkv.runtime.rerank import QWEN3_PREFIX, QWEN3_SUFFIX
from agentkv.server.app import create_app
from agentkv.server.scoring import MAX_DOCUMENTS
from tests.models import retrieval_helpers as rh
from tests.server.conftest import serve

RTOL = 1e-5
KEYS = {"key-a": "tenant-a", "key-b": "tenant-b", **{f"cold-{i}": f"cold-{i}" for i in range(len(rh.DOCUMENTS))}}


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert-ce")
    rh.bert_cross_encoder(folder, resolve_model_path("minilm"))
    engine = AsyncEngine.from_model(str(folder))
    yield from serve(create_app(engine, served_model_name="ce", strict_request_fields=True), engine)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-reranker")
    hf = rh.qwen3(folder, embedding=False)
    engine = AsyncEngine.from_model(str(folder), kv_cache_blocks=256, kv_cache_dtype="f32")
    engine.start()
    for server in serve(create_app(engine, served_model_name="qr", api_key=KEYS), engine):
        yield server, folder, hf


def ce_oracle(folder) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu").predict([(rh.QUERY, d) for d in rh.DOCUMENTS])


def test_cohere_client_reranks_like_sentence_transformers(cross_encoder):
    import cohere

    want = ce_oracle(cross_encoder.engine.engine.source.path)
    order = [int(i) for i in np.argsort(-want, kind="stable")]
    v2 = cohere.ClientV2(base_url=cross_encoder.base_url, api_key="unused", timeout=60)
    res = v2.rerank(model="ce", query=rh.QUERY, documents=rh.DOCUMENTS, top_n=3)
    assert [r.index for r in res.results] == order[:3]
    np.testing.assert_allclose([r.relevance_score for r in res.results], want[order[:3]], rtol=RTOL)
    v1 = cohere.Client(base_url=cross_encoder.base_url, api_key="unused", timeout=60)
    res = v1.rerank(model="ce", query=rh.QUERY, documents=rh.DOCUMENTS, return_documents=True)
    assert [r.index for r in res.results] == order
    assert [r.document.text for r in res.results] == [rh.DOCUMENTS[i] for i in order]
    np.testing.assert_allclose([r.relevance_score for r in res.results], want[order], rtol=RTOL)


def test_langchain_cohere_rerank_compresses_documents(cross_encoder):
    """LangChain's CohereRerank (a document compressor that takes a base URL) over agentkv."""
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    want = ce_oracle(cross_encoder.engine.engine.source.path)
    reranker = CohereRerank(model="ce", top_n=2, base_url=cross_encoder.base_url, cohere_api_key="unused")
    docs = reranker.compress_documents([Document(page_content=d) for d in rh.DOCUMENTS], rh.QUERY)
    best = [int(i) for i in np.argsort(-want, kind="stable")[:2]]
    assert [d.page_content for d in docs] == [rh.DOCUMENTS[i] for i in best]
    np.testing.assert_allclose([d.metadata["relevance_score"] for d in docs], want[best], rtol=RTOL)


def test_score_one_to_many_and_one_to_one(cross_encoder):
    want = ce_oracle(cross_encoder.engine.engine.source.path)
    with httpx.Client(base_url=cross_encoder.base_url, timeout=60) as http:
        many = http.post("/score", json={"model": "ce", "text_1": rh.QUERY, "text_2": rh.DOCUMENTS})
        pairs = http.post("/v1/score", json={"queries": [rh.QUERY] * 2, "documents": rh.DOCUMENTS[:2]})
        jina = http.post(
            "/rerank",
            json={
                "query": rh.QUERY,
                "documents": [{"text": d, "id": str(i)} for i, d in enumerate(rh.DOCUMENTS)],
                "top_n": 1,
            },
        )
        cut = http.post("/v2/rerank", json={"query": rh.QUERY, "documents": [rh.DOCUMENTS[0]], "max_tokens_per_doc": 2})
        first_words = http.post("/v2/rerank", json={"query": rh.QUERY, "documents": ["paris is"]})
    assert many.status_code == pairs.status_code == jina.status_code == 200, many.text + pairs.text + jina.text
    body = many.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == list(range(len(rh.DOCUMENTS)))
    np.testing.assert_allclose([d["score"] for d in body["data"]], want, rtol=RTOL)
    assert [d["score"] for d in pairs.json()["data"]] == [d["score"] for d in body["data"][:2]]
    assert jina.json()["results"][0]["index"] == int(np.argmax(want))
    assert cut.json()["results"][0]["relevance_score"] == first_words.json()["results"][0]["relevance_score"]
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["d"] * (MAX_DOCUMENTS + 1)}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "rank_fields": ["x"]}, "rank_fields"),
        ("/v1/rerank", {"query": "q", "documents": ["word " * 600]}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
        ("/v1/rerank", {"documents": ["d"]}, "query"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
        ("/score", {"text_1": "a", "documents": ["b"]}, "queries"),
        ("/score", {"text_1": "a"}, "text_2"),
        ("/classify", {"input": []}, "input"),
    ],
)
def test_bad_bodies_get_the_apis_400(cross_encoder, path, body, param):
    r = httpx.post(cross_encoder.base_url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_classify_gives_the_heads_probability(cross_encoder):
    want = ce_oracle(cross_encoder.engine.engine.source.path)  # CrossEncoder: sigmoid of the one logit
    r = httpx.post(cross_encoder.base_url + "/classify", json={"input": "just one text"}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"][0]
    assert data["num_classes"] == 1 and data["label"] == "LABEL_0" and 0.0 < data["probs"][0] < 1.0
    assert want.shape == (len(rh.DOCUMENTS),)


def hf_judge(hf, folder) -> np.ndarray:
    """The Qwen3-Reranker model card's scoring, pair by pair, on the transformers model."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    instruction = "Given a web search query, retrieve relevant passages that answer the query"
    scores = []
    for doc in rh.DOCUMENTS:
        body = f"<Instruct>: {instruction}\n<Query>: {rh.QUERY}\n<Document>: {doc}"
        ids = [tok.encode(part, add_special_tokens=False) for part in (QWEN3_PREFIX, body, QWEN3_SUFFIX)]
        with torch.no_grad():
            logits = hf(torch.tensor([sum(ids, [])])).logits[0, -1]
        pair = torch.log_softmax(torch.stack([logits[no], logits[yes]]).double(), dim=0)
        scores.append(pair[1].exp().item())
    return np.array(scores)


def rerank_as(server, key: str, documents=rh.DOCUMENTS) -> dict:
    r = httpx.post(
        server.base_url + "/v1/rerank",
        json={"model": "qr", "query": rh.QUERY, "documents": documents},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_causal_reranker_matches_transformers_and_prefills_the_query_once(reranker):
    server, folder, hf = reranker
    want = hf_judge(hf, folder)
    body = rerank_as(server, "key-a")
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(rh.DOCUMENTS))], want, rtol=RTOL)
    assert [r["index"] for r in body["results"]] == [int(i) for i in np.argsort(-want, kind="stable")]
    # Every pair after the first found at least the shared instruction + query in the cache.
    tok = server.engine.tokenizer
    prompts = [_prompt(tok, d) for d in rh.DOCUMENTS]
    shared = _common_prefix_len(prompts)
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(map(len, prompts))
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(prompts) - 1) * shared > 0


def test_cached_scores_equal_cold_scores_bit_for_bit_and_tenants_do_not_share(reranker):
    server, _, _ = reranker
    warm = rerank_as(server, "key-b")
    again = rerank_as(server, "key-b")  # everything but each prompt's last token now cached
    warm_scores = sorted((r["index"], r["relevance_score"]) for r in warm["results"])
    assert sorted((r["index"], r["relevance_score"]) for r in again["results"]) == warm_scores
    prompts = [_prompt(server.engine.tokenizer, d) for d in rh.DOCUMENTS]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == sum(len(p) - 1 for p in prompts)
    # Cold: each pair alone, in a tenant namespace that holds nothing of it (its own key).
    cold = [rerank_as(server, f"cold-{i}", [doc]) for i, doc in enumerate(rh.DOCUMENTS)]
    assert [c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in cold] == [0] * len(cold)
    cold_scores = np.array([c["results"][0]["relevance_score"] for c in cold])
    assert np.array_equal(cold_scores, np.array([s for _, s in warm_scores]))


def _prompt(tok, doc: str) -> list[int]:
    from agentkv.runtime.rerank import pair_prompt

    return pair_prompt(tok, rh.QUERY, doc)


def _common_prefix_len(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def test_causal_reranker_refuses_more_documents_than_the_fanout_and_over_long_pairs(reranker):
    server = reranker[0]
    headers = {"Authorization": "Bearer key-a"}
    too_many = httpx.post(
        server.base_url + "/v1/rerank", json={"query": "q", "documents": ["d"] * 65}, headers=headers, timeout=60
    )
    assert too_many.status_code == 400 and "--max-fanout" in too_many.json()["error"]["message"]
    long = httpx.post(
        server.base_url + "/v1/rerank", json={"query": "q", "documents": ["paris " * 300]}, headers=headers, timeout=60
    )
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"


RANK_GGUF_Q8_RTOL = 6e-2  # Q8_0 against f32 weights: at most 4.2e-2 relative seen on these peaky random scores


def test_llama_cpp_rank_gguf_scores_as_the_hf_folder(reranker, tmp_path):
    """A Qwen3 reranker in llama.cpp's GGUF layout (rank pooling, yes/no `cls.output`; written
    as its converter does, tests/models/retrieval_helpers.py) is served by /v1/rerank with the
    folder's scores: bit-identical from the same f32 weights; from Q8_0 weights within the
    recorded floor, and then not bit-identical (the control: the equality can fail)."""
    server, folder, hf = reranker
    want = [r["relevance_score"] for r in sorted(rerank_as(server, "key-a")["results"], key=lambda r: r["index"])]
    got = {}
    for qtype in (None, "Q8_0"):
        path = rh.qwen3_rank_gguf(folder, hf, tmp_path / f"rank-{qtype}.gguf", qtype)
        engine = AsyncEngine.from_model(str(path), kv_cache_blocks=256, kv_cache_dtype="f32")
        engine.start()
        for live in serve(create_app(engine, served_model_name="qr", api_key=KEYS), engine):
            results = rerank_as(live, "key-a")["results"]
            got[qtype] = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
        asyncio.run(engine.shutdown())
    assert np.array_equal(got[None], want)
    np.testing.assert_allclose(got["Q8_0"], want, rtol=RANK_GGUF_Q8_RTOL)
    assert not np.array_equal(got["Q8_0"], want)


def test_an_untied_rank_gguf_is_refused_naming_the_tensor(reranker, tmp_path):
    """llama.cpp's converter keeps an untied reranker's head only as the two `cls.output` rows;
    scoring through `token_embd` would be wrong, so loading says so."""
    _, folder, hf = reranker
    rows = np.random.default_rng(0).standard_normal((2, hf.config.hidden_size)).astype(np.float32)
    path = rh.qwen3_rank_gguf(folder, hf, tmp_path / "untied.gguf", head_rows=rows)
    with pytest.raises(ValueError, match="cls.output.weight is not token_embd.weight's rows"):
        AsyncEngine.from_model(str(path))
