"""Encoder rerankers and XLM-RoBERTa embeddings against transformers and sentence-transformers:
BERT cross-encoders (`BertForSequenceClassification`: pooler + classifier on a pair with its
segment ids), XLM-RoBERTa's classifier head (dense + tanh + out_proj on <s>; positions from
padding_idx + 1) and `XLMRobertaModel` CLS embeddings (BGE-M3's dense vectors).

Tolerance: 1e-5 relative on sigmoid scores and unit-vector cosines >= 1 - 1e-6: the same float32
weights, only summation order differs (~1e-7 seen); orderings must be equal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.formats.resolve import open_model, resolve_model_path
from agentkv.formats.tokenizer import load_tokenizer
from agentkv.hal.registry import lookup
from agentkv.models.registry import load_model
from agentkv.runtime.rerank import sigmoid
from tests.models import retrieval_helpers as rh
from tests.models.helpers import BACKENDS, cosines

RTOL = 1e-5
PAIRS = [(rh.QUERY, d) for d in rh.DOCUMENTS]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    out = {}
    for kind in ("bert", "xlmr", "xlmr-embed"):
        folder = tmp_path_factory.mktemp(kind)
        if kind == "bert":
            rh.bert_cross_encoder(folder, resolve_model_path("minilm"))
        else:
            rh.xlm_roberta(folder, classifier=kind == "xlmr")
        out[kind] = folder
    return out


@pytest.mark.parametrize("kind", ["bert", "xlmr"])
def test_tokenizer_joins_pairs_as_transformers_does(folders, kind):
    from transformers import AutoTokenizer

    ours, theirs = load_tokenizer(open_model(folders[kind])), AutoTokenizer.from_pretrained(folders[kind])
    for query, doc in PAIRS:
        ids, types = ours.encode_pair(query, doc)
        enc = theirs(query, doc)
        assert ids == enc["input_ids"]
        assert types == enc.get("token_type_ids", [0] * len(ids))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bert", "xlmr"])
def test_cross_encoder_scores_match_sentence_transformers(folders, kind, backend):
    from sentence_transformers import CrossEncoder

    want = CrossEncoder(str(folders[kind]), device="cpu").predict(PAIRS)
    source = open_model(folders[kind])
    model = load_model(source, lookup(backend))
    assert model.num_labels == 1 and model.is_embedding
    pairs = [load_tokenizer(source).encode_pair(q, d) for q, d in PAIRS]
    logits = model.classify([ids for ids, _ in pairs], [types for _, types in pairs])
    got = np.array([sigmoid(x) for x in logits[:, 0]])
    np.testing.assert_allclose(got, want, rtol=RTOL)
    assert np.argsort(-got).tolist() == np.argsort(-want).tolist()
    # One flat padding-free batch: a pair's logits do not depend on what rides with it.
    np.testing.assert_array_equal(model.classify([pairs[1][0]], [pairs[1][1]]), logits[1:2])


def test_xlm_roberta_cls_embeddings_match_transformers(folders):
    from transformers import AutoTokenizer, XLMRobertaModel

    folder = folders["xlmr-embed"]
    hf = XLMRobertaModel.from_pretrained(folder).eval()
    enc = AutoTokenizer.from_pretrained(folder)(rh.DOCUMENTS)
    want = []
    with torch.no_grad():
        for ids in enc["input_ids"]:
            want.append(hf(torch.tensor([ids])).last_hidden_state[0, 0].numpy())
    want = np.stack(want)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    model = load_model(open_model(folder), lookup("cpu"))
    assert model.pooling == "cls" and model.num_labels == 0 and model.config.position_offset == 2
    got = model.embed(enc["input_ids"])
    assert cosines(got, want).min() >= 1 - 1e-6
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_a_model_without_a_head_refuses_to_classify(folders):
    model = load_model(open_model(folders["xlmr-embed"]), lookup("reference"))
    with pytest.raises(ValueError, match="has no classification head"):
        model.classify([[0, 5, 2]])
    bert = load_model(open_model(folders["bert"]), lookup("reference"))
    with pytest.raises(ValueError, match="segment id 2; the model has 2 segments"):
        bert.classify([[101, 102]], [[0, 2]])
