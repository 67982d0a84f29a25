"""Qwen3-Embedding: the Qwen3 decoder read as an embedding model. The final norm's row of each
sequence's last token (its <|endoftext|>, which the tokenizer appends) is the embedding, L2
normalised; it is Matryoshka-trained, so a prefix of it, renormalised, is an embedding too.

A folder is this family when sentence-transformers' 1_Pooling says `pooling_mode_lasttoken`,
a GGUF when `qwen3.pooling_type` is 3 (last). Queries carry their instruction in the text
(`Instruct: {task}\\nQuery:{query}`), as the model card asks of the caller."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agentkv.hal.base import AttnMeta, KVSpec
from agentkv.models.bert import l2_normalise
from agentkv.models.llama import LlamaModel

_BLOCK = 16  # the scratch KV's block size: any works, the keys are the sequence's own


class Qwen3EmbeddingModel(LlamaModel):
    is_embedding = True
    matryoshka = True
    pooling = "last"

    def embed(self, token_id_lists: Sequence[Sequence[int]]) -> np.ndarray:
        """L2-normalised last-token embeddings `[batch, hidden]` float32. All sequences run as
        one flat causal batch over a scratch KV store (dropped after the call), each in its
        own blocks: no padding, so a sequence's vector does not depend on its batch."""
        hp, be = self.hparams, self.backend
        seq_lens = [len(t) for t in token_id_lists]
        if not seq_lens:
            raise ValueError("embed needs at least one sequence, got an empty batch")
        for i, (ids, n) in enumerate(zip(token_id_lists, seq_lens)):
            if not 0 < n <= hp.context_len:
                raise ValueError(f"sequence {i} has {n} tokens; {hp.arch} takes 1..{hp.context_len}")
            bad = [t for t in ids if not 0 <= int(t) < hp.vocab_size]
            if bad:
                raise ValueError(f"sequence {i} has token id {bad[0]} outside the vocabulary 0..{hp.vocab_size - 1}")
        meta = _meta(seq_lens)
        num_blocks = sum(math.ceil(n / _BLOCK) for n in seq_lens)
        kv = be.allocate_kv(KVSpec(hp.num_layers, num_blocks, _BLOCK, hp.num_kv_heads, hp.head_dim, be.kv_dtype))
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_id_lists])
        h = be.embedding(self.token_embd, ids)  # [n, d]
        x = be.rms_norm(h, self.layers[0].attention.norm, hp.norm_eps)
        _, x = be.decoder_blocks(h, x, self.layers, self.blocks, meta, kv, self.norm)
        last = np.cumsum(seq_lens) - 1
        return l2_normalise(be.read(be.take_rows(x, last)))  # [batch, d]

    def forward(self, token_ids, meta, kv, logit_rows):
        """Not available: served as an embedding model (no LM head use) — call `embed`."""
        raise NotImplementedError("Qwen3-Embedding is served as an embedding model: call embed(token_id_lists)")


def _meta(seq_lens: list[int]) -> AttnMeta:
    """Each sequence prefilled whole from position 0 in its own run of scratch blocks."""
    tables, slots, next_block = [], [], 0
    for n in seq_lens:
        blocks = tuple(range(next_block, next_block + math.ceil(n / _BLOCK)))
        next_block += len(blocks)
        pos = np.arange(n, dtype=np.int64)
        tables.append(blocks)
        slots.append(np.asarray(blocks, dtype=np.int64)[pos // _BLOCK] * _BLOCK + pos % _BLOCK)
    return AttnMeta(
        query_lens=tuple(seq_lens),
        context_lens=tuple(seq_lens),
        block_tables=tuple(tables),
        positions=np.concatenate([np.arange(n, dtype=np.int64) for n in seq_lens]),
        slot_mapping=np.concatenate(slots),
    )
