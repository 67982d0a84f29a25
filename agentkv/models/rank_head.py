"""llama.cpp's causal-reranker GGUF layout (what its converter writes for Qwen3-Reranker):
`<arch>.pooling_type` 4 (rank), `<arch>.classifier.output_labels` ["yes", "no"] and
`cls.output.weight` = the LM head's rows of those two tokens. agentkv scores such a model as
it scores the HF folder, through the LM head: sigmoid(logit(yes) - logit(no)) at the last
position, which is llama.cpp's softmax over the two `cls.output` logits. The converter keeps no
`output.weight`, so the head is `token_embd` -- right for a tied model only (the two rows then
match, up to the two tensors' quantizations); an untied one (whose real head survives only as
those two rows) is refused rather than scored wrong."""

from __future__ import annotations

import numpy as np

from agentkv.formats.source import ModelSource

RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
# The same rows stored in two quantizations (a Q6_K token_embd, an f16 cls.output) stay this
# close; an untied model's head rows and embedding rows are unrelated (cosine near 0).
SAME_ROWS = 0.99


def check_rank_head(source: ModelSource) -> None:
    """Raise ValueError (naming the file and tensors) for a rank-pooled causal GGUF whose
    `cls.output` rows are not `token_embd`'s rows of its labels; no-op for any other model."""
    arch = source.hparams.arch
    meta = source.metadata
    if meta.get(f"{arch}.pooling_type") != RANK_POOLING or not source.has_tensor("cls.output.weight"):
        return
    if source.has_tensor("output.weight"):
        return  # a full LM head: the labels' logits come from it as in the HF folder
    labels = list(meta.get(f"{arch}.classifier.output_labels") or [])
    tokens = list(meta.get("tokenizer.ggml.tokens") or [])
    missing = [label for label in labels if label not in tokens]
    if len(labels) != 2 or missing:
        raise ValueError(
            f"{source.path}: a rank-pooled {arch} GGUF needs classifier.output_labels of two tokens in "
            f"its vocabulary (a yes and a no), got {labels!r}"
            + (f"; not in the vocabulary: {missing}" if missing else "")
        )
    head = source.dequantized("cls.output.weight")
    embd = source.tensor("token_embd.weight")
    from agentkv.formats.quants import dequantize

    ids = [tokens.index(label) for label in labels]
    rows = dequantize(np.ascontiguousarray(embd.data[ids]), embd.qtype).reshape(2, -1).astype(np.float32)
    if head.shape != rows.shape or min(_cosines(head, rows)) < SAME_ROWS:
        raise ValueError(
            f"{source.path}: cls.output.weight is not token_embd.weight's rows of {labels!r}: an untied "
            f"reranker, whose LM head this GGUF keeps only as those two rows; agentkv scores a causal "
            f"reranker through its LM head, so serve its HF folder instead"
        )


def _cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return [float(x) for x in (a * b).sum(axis=1) / np.maximum(norms, 1e-30)]
