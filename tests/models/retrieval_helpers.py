"""Tiny random retrieval models written by transformers for the rerank/score/embedding tests:
a BERT cross-encoder (with the packaged MiniLM's tokenizer), XLM-RoBERTa classifier and
encoder, and Qwen3 causal models (a reranker and a last-token-pooled embedding model), each
with a tokenizer built here by the `tokenizers` library. Weights are random, so every score
is arbitrary but deterministic; the oracles load the same folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

QUERY = "what is the capital of france"
DOCUMENTS = [
    "paris is the capital and largest city of france",
    "the quick brown fox jumps over the lazy dog",
    "berlin is the capital of germany",
    "france is a country in western europe and its capital is paris",
    "a short one",
]
_WORDS = sorted({w for text in [QUERY, *DOCUMENTS] for w in text.split()} | {"yes", "no", "query", "document"})
ENCODER_DIMS = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128
)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Norm gains and biases random too (HF's constants would hide a misplaced one)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))


def bert_cross_encoder(folder: Path, minilm_path: Path, seed: int = 0):
    """BertForSequenceClassification (1 label, pooler + classifier) with MiniLM's tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=30522, num_labels=1, initializer_range=0.2, **ENCODER_DIMS)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    _randomise(model, seed)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_path / name, folder / name)
    return model


def _wordlevel_tokenizer(folder: Path, specials: list[str], post) -> None:
    """A whitespace word-level tokenizer over this module's words, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate([*specials, *_WORDS])}
    unk = next(s for s in specials if "unk" in s)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = post
    tok.save(str(folder / "tokenizer.json"))


def xlm_roberta(folder: Path, classifier: bool, seed: int = 0):
    """XLMRobertaForSequenceClassification (1 label) or XLMRobertaModel, with an XLM-R style
    tokenizer (`<s> a </s></s> b </s>`, <pad> = 1 so positions start at 2)."""
    from tokenizers import processors
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    _wordlevel_tokenizer(folder, specials, processors.RobertaProcessing(("</s>", 2), ("<s>", 0)))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "sep_token": "</s>",
                "cls_token": "<s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "model_max_length": 120,
            }
        )
    )
    config = XLMRobertaConfig(
        vocab_size=len(specials) + len(_WORDS) + 3,
        num_labels=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
        initializer_range=0.2,
        **{**ENCODER_DIMS, "max_position_embeddings": 130},
    )
    torch.manual_seed(seed)
    model = (XLMRobertaForSequenceClassification if classifier else XLMRobertaModel)(config).eval()
    _randomise(model, seed)
    model.save_pretrained(folder)
    return model


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def qwen3_tokenizer(folder: Path, append_eos: bool) -> None:
    """A byte-level BPE over a small corpus with Qwen's chat specials and `yes` / `no` as
    whole tokens; `append_eos`: <|endoftext|> closes every encoding (Qwen3-Embedding's)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [QUERY, *DOCUMENTS, "Judge whether the Document meets the requirements", "Instruct Query"]
    tok.train_from_iterator(corpus * 4, trainer)
    tok.add_tokens([AddedToken("yes", normalized=False), AddedToken("no", normalized=False)])
    if append_eos:
        eos = tok.token_to_id("<|endoftext|>")
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", pair="$A $B <|endoftext|>", special_tokens=[("<|endoftext|>", eos)]
        )
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def qwen3(folder: Path, embedding: bool, seed: int = 0):
    """A tiny Qwen3 causal LM (the reranker), or the same saved as a sentence-transformers
    last-token-pooled embedding model (Qwen3-Embedding's folder: 1_Pooling + normalise)."""
    from tests.models.helpers import tiny_hf_model

    qwen3_tokenizer(folder, append_eos=embedding)
    model = tiny_hf_model(folder, "qwen3", seed=seed, vocab_size=320, head_dim=16, tie_word_embeddings=True)
    if embedding:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "include_prompt": True})
        )
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (folder / "modules.json").write_text(json.dumps(modules))
        (folder / "2_Normalize").mkdir()
    return model


def qwen3_rank_gguf(folder: Path, hf, path: Path, qtype: str | None = None, head_rows=None) -> Path:
    """The Qwen3 reranker in `folder` as llama.cpp's converter writes a Qwen3-Reranker
    (conversion/qwen.py): arch `qwen3`, pooling_type 4 (rank), classifier labels
    ["yes", "no"], a `rerank` chat template with {query} and {document}, and `cls.output.weight`
    the LM head's "yes" and "no" rows stacked (the tied embeddings kept as `token_embd`).
    The vocabulary is the folder's tokenizer.json as a 'gpt2' BPE (pre 'qwen2'). `qtype`
    (e.g. "Q8_0") quantizes the matrices; `head_rows` replaces the two head rows (an untied
    model's)."""
    import gguf

    cfg = hf.config
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    added = {t["content"] for t in spec["added_tokens"]} - special
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float((cfg.rope_parameters or {}).get("rope_theta", 10000.0)))
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 4 if t in added else 1 for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_vocab_size(cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, cfg.num_hidden_layers)
    state = {k: v.detach().float().numpy().copy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    embed = state["model.embed_tokens.weight"]
    state["cls.output.weight"] = np.stack([embed[vocab["yes"]], embed[vocab["no"]]]) if head_rows is None else head_rows
    for hf_name, data in state.items():
        name = hf_name if hf_name.startswith("cls.") else names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if qtype is not None and data.ndim == 2:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# What llama.cpp's converter stores as the `rerank` chat template of a Qwen3-Reranker GGUF.
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a '
    "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
