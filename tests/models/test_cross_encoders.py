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


def write_rank_gguf(hf, path) -> None:
    """The cross-encoder as llama.cpp's converter writes a BERT reranker: arch `bert`, the
    `bert.` prefix dropped, pooler -> `cls`, classifier -> `cls.output`, pooling_type 4 (rank)."""
    import gguf

    cfg = hf.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg.num_hidden_layers)
    renames = {"pooler.dense": "classifier.dense", "classifier": "classifier.out_proj"}
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_layer_norm_eps(cfg.layer_norm_eps)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_vocab_size(cfg.vocab_size)
    for hf_name, tensor in hf.state_dict().items():
        base, _, suffix = hf_name.removeprefix("bert.").rpartition(".")
        name = names.get_name(f"{renames.get(base, base)}.{suffix}", try_suffixes=(".weight", ".bias"))
        if name is not None:  # position_ids is a buffer, not a weight
            writer.add_tensor(name, tensor.detach().float().numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_llama_cpp_rank_gguf_scores_like_transformers(folders, tmp_path):
    from transformers import BertForSequenceClassification

    hf = BertForSequenceClassification.from_pretrained(folders["bert"]).eval()
    write_rank_gguf(hf, tmp_path / "rerank.gguf")
    model = load_model(open_model(tmp_path / "rerank.gguf"), lookup("cpu"))
    assert model.config.pooling == "rank" and model.num_labels == 1
    pairs = [load_tokenizer(open_model(folders["bert"])).encode_pair(q, d) for q, d in PAIRS]
    got = model.classify([ids for ids, _ in pairs], [types for _, types in pairs])[:, 0]
    with torch.no_grad():
        want = [hf(input_ids=torch.tensor([i]), token_type_ids=torch.tensor([t])).logits[0, 0].item() for i, t in pairs]
    np.testing.assert_allclose([sigmoid(x) for x in got], [sigmoid(x) for x in want], rtol=RTOL)
