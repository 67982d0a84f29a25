"""What a retrieval model can do, and how a causal LM reranks: the Qwen3-Reranker prompt
around a (query, document) pair, the "yes" / "no" token ids it is scored by, and the score.

A causal reranker judges each pair as the next token of one prompt:

    prefix (system + "<|im_start|>user\\n")  "<Instruct>: I\\n<Query>: Q\\n<Document>: D"  suffix
    └──────────── the same for every document of one query ─────────┘└─ per document ─┘

so ranking N documents is N prompts with a long common prefix, which the radix cache
prefills once; score = P(yes) over {yes, no} = sigmoid(logit(yes) - logit(no)) at the last
position (the model card's log_softmax over the two logits, then exp)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

# The Qwen3-Reranker model card's prompt, verbatim.
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
YES, NO = "yes", "no"


class Traits(NamedTuple):
    """What a loaded model offers beyond generation: a classification head's labels (encoders
    with one), and whether its embeddings may be truncated (Matryoshka: Qwen3-Embedding)."""

    num_labels: int = 0
    label_names: tuple[str, ...] = ()
    matryoshka: bool = False


def traits_of(model: Any) -> Traits:
    config = getattr(model, "config", None)
    return Traits(
        num_labels=getattr(model, "num_labels", 0),
        label_names=tuple(getattr(config, "label_names", ()) or ()),
        matryoshka=bool(getattr(model, "matryoshka", False)),
    )


def judge_ids(tokenizer: Any) -> tuple[int, int]:
    """(id of "yes", id of "no"); ValueError naming the token a vocabulary lacks."""
    ids = tokenizer.token_to_id(YES), tokenizer.token_to_id(NO)
    for word, token_id in zip((YES, NO), ids):
        if token_id is None:
            raise ValueError(f"this model's vocabulary has no {word!r} token, so it cannot rerank as a causal LM")
    return ids


def pair_prompt(tokenizer: Any, query: str, document: str, instruction: str | None = None) -> list[int]:
    """The token ids of one (query, document) judgement, tokenised as the model card does:
    prefix, the formatted pair and suffix each on its own, without special tokens."""
    body = f"<Instruct>: {instruction or QWEN3_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    encode = tokenizer.encode
    return encode(QWEN3_PREFIX, False) + encode(body, False) + encode(QWEN3_SUFFIX, False)


def judge_score(yes_logit: float, no_logit: float) -> float:
    """P(yes) over {yes, no}: sigmoid(yes - no), in float64 from the float32 logits."""
    diff = float(yes_logit) - float(no_logit)
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    e = math.exp(diff)
    return e / (1.0 + e)


def sigmoid(x: float) -> float:
    """A one-label classifier's score (sentence-transformers' CrossEncoder default)."""
    return judge_score(x, 0.0)
