"""The synthetic reranker's GGUF in llama.cpp's Qwen3-Reranker layout (what its converter
writes: `pooling_type` 4 = rank, `classifier.output_labels` ["yes", "no"], a `rerank` chat
template with {query} and {document}, `cls.output.weight` = the head's yes/no rows), with a
vocabulary whose text pieces are one CJK character each, so a prompt of token ids is also a
text that both engines tokenise back into exactly those ids (llama-server's /rerank takes
text only):

    id   0..2     <unk> <s> </s>          id 300, 301   "yes", "no" (the judged tokens)
    id   3..258   byte pieces <0xNN>      id 302..      U+4E00 + (id - 302), up to 20000 of them
    id 259..299   filler pieces           then          filler pieces to the vocabulary's size

A prompt is [shared prefix | document | suffix]: the prefix is the query, the document the
document, and the fixed suffix is the template's tail."""

from __future__ import annotations

from typing import Any

JUDGE_IDS = (300, 301)  # "yes", "no"
FIRST_TEXT_ID = 302
MAX_TEXT_IDS = 20000
CJK = 0x4E00


def text_id_range(vocab: int) -> tuple[int, int]:
    """[first, end) of the ids whose piece is one character."""
    if vocab <= FIRST_TEXT_ID + 8:
        raise ValueError(f"vocab {vocab} is too small for a text range: it needs > {FIRST_TEXT_ID + 8} pieces")
    return FIRST_TEXT_ID, min(vocab, FIRST_TEXT_ID + MAX_TEXT_IDS)


def text_of(ids: list[int]) -> str:
    """The text of text-range ids (the pieces concatenated)."""
    return "".join(chr(CJK + i - FIRST_TEXT_ID) for i in ids)


def suffix_ids(vocab: int, length: int) -> list[int]:
    """The fixed suffix every prompt ends with (the rerank template's tail)."""
    first, end = text_id_range(vocab)
    return [end - 1 - k for k in range(length)]


def write_rank_metadata(writer: Any, vocab: int, suffix_len: int) -> None:
    """Vocabulary (SentencePiece-style, no space prefix) and the rank-pooling keys."""
    import gguf

    first, end = text_id_range(vocab)
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)]]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), JUDGE_IDS[0])] + ["yes", "no"]
    tokens += [chr(CJK + i - first) for i in range(first, end)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), vocab)]
    fixed = 3 + 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * fixed + [-float(i) for i in range(vocab - fixed)])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - fixed))  # unknown, control, byte, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    template = "{query}{document}" + text_of(suffix_ids(vocab, suffix_len))
    writer.add_chat_template([{"name": "rerank", "template": template}])
