"""BERT-style encoders: sentence embeddings (all-MiniLM-L6-v2, BGE-M3's XLM-RoBERTa) and
cross-encoders (ms-marco MiniLM, BGE-reranker). Absolute position embeddings, post-LN layers,
erf-GELU MLP, bidirectional attention with no KV cache, then pooling and L2 normalisation as
sentence-transformers does, or a classification head on the first token.

    h = LN(word + position + token_type)          XLM-R: positions start at padding_idx + 1
    per layer:  h = LN(h + attention(h))          attn_output_norm
                h = LN(h + down(gelu(up(h))))      layer_output_norm
    embedding = normalise(pool(h))                 pool: config.pooling (mean | cls | last)
    logits    = out(tanh(dense(h[0])))             `cls` + `cls.output`: BERT's pooler +
                                                   classifier, XLM-R's classifier head
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentkv.formats.source import HParams, ModelSource
from agentkv.hal.base import Tensor
from agentkv.models.base import LoadOptions, Model
from agentkv.models.config import SourceKeys

POOLING = ("mean", "cls", "last")
# llama.cpp's enum llama_pooling_type, as stored in `<arch>.pooling_type`.
GGUF_POOLING = {0: None, 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# sentence-transformers' 1_Pooling/config.json flags, in the order they are tried.
FOLDER_POOLING = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_lasttoken", "last"),
)


@dataclass(frozen=True, slots=True)
class BertConfig:
    """BERT's own knowledge on top of the shared hparams: how a sentence is pooled, as the
    file says (None: it does not say)."""

    hparams: HParams
    pooling: str | None = None
    # XLM-RoBERTa numbers positions from padding_idx + 1 (HF folders); llama.cpp's converter
    # drops those first rows of the table instead, so a GGUF starts at 0.
    position_offset: int = 0
    label_names: tuple[str, ...] = ()  # config.json id2label, in label order

    @classmethod
    def from_source(cls, source: ModelSource) -> BertConfig:
        return cls.from_keys(SourceKeys.of(source))

    @classmethod
    def from_keys(cls, keys: SourceKeys) -> BertConfig:
        """From the file's shared hparams and raw keys (`SourceKeys(hparams, kind, path)`)."""
        if keys.gguf:
            return cls(keys.hparams, GGUF_POOLING.get(keys.get("pooling_type", None, 0)))
        flags = keys.raw.get("pooling_config") or {}
        pooling = next((mode for key, mode in FOLDER_POOLING if flags.get(key)), None)
        offset = int(keys.raw.get("pad_token_id", 1)) + 1 if keys.raw.get("model_type") == "xlm-roberta" else 0
        id2label = keys.raw.get("id2label") or {}
        labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        return cls(keys.hparams, pooling, offset, labels)

    def summary(self) -> dict[str, Any]:
        """The family-resolved hparams `agentkv inspect` reports."""
        return {"pooling": self.pooling, "position_offset": self.position_offset}


class BertModel(Model):
    is_embedding = True
    config_type = BertConfig

    def __init__(self, source, backend, options: LoadOptions = LoadOptions()):
        super().__init__(source, backend, options)
        hp = self.hparams
        self.pooling = self.config.pooling or "cls"  # a bare BERT folder (no 1_Pooling/) pools [CLS]
        if self.pooling == "rank":  # llama.cpp's reranker GGUF: its head reads [CLS]; so does `embed`
            self.pooling = "cls"
            if not source.has_tensor("cls.output.weight"):
                raise ValueError(f"{source.path}: pooling 'rank' needs the classifier tensor 'cls.output.weight'")
        if self.pooling not in POOLING:
            raise ValueError(
                f"{source.path}: pooling {self.pooling!r} is not supported (supported: {', '.join(POOLING)})"
            )
        self.scale = 1.0 / math.sqrt(hp.head_dim)
        self.word = self.weight("token_embd.weight")
        self.position = self.weight("position_embd.weight")
        self.token_types = self.weight("token_types.weight")
        self.embd_norm = (self.weight("token_embd_norm.weight"), self.weight("token_embd_norm.bias"))
        self.layers = [self._layer(i) for i in range(hp.num_layers)]
        self.head = self._head()
        self.num_labels = self.head["out"].shape[0] if self.head else 0
        self.num_token_types = self.token_types.shape[0]
        self.max_len = hp.context_len - self.config.position_offset  # the position table's rows

    def _head(self) -> dict | None:
        """The classification head (`cls` dense + tanh, then `cls.output`); None for an
        embedding model. A head with only `cls.output` projects the first token directly."""
        out = self.weight("cls.output.weight", required=False)
        if out is None:
            return None
        w = lambda name: self.weight(name, required=False)  # noqa: E731
        return {"dense": w("cls.weight"), "dense_bias": w("cls.bias"), "out": out, "out_bias": w("cls.output.bias")}

    def _layer(self, i: int) -> dict:
        w = lambda name: self.weight(f"blk.{i}.{name}")  # noqa: E731
        return {
            "q": w("attn_q.weight"),
            "q_bias": w("attn_q.bias"),
            "k": w("attn_k.weight"),
            "k_bias": w("attn_k.bias"),
            "v": w("attn_v.weight"),
            "v_bias": w("attn_v.bias"),
            "o": w("attn_output.weight"),
            "o_bias": w("attn_output.bias"),
            "attn_norm": (w("attn_output_norm.weight"), w("attn_output_norm.bias")),
            "up": w("ffn_up.weight"),
            "up_bias": w("ffn_up.bias"),
            "down": w("ffn_down.weight"),
            "down_bias": w("ffn_down.bias"),
            "out_norm": (w("layer_output_norm.weight"), w("layer_output_norm.bias")),
        }

    def forward(self, token_ids, meta, kv, logit_rows) -> Tensor:
        """Not available: an encoder has no causal step, KV cache or logits — use `embed`."""
        raise NotImplementedError(
            "BERT is an embedding encoder (bidirectional, no KV cache, "
            "no LM head): call embed(token_id_lists) instead of forward"
        )

    def embed(self, token_id_lists: Sequence[Sequence[int]], type_id_lists=None) -> np.ndarray:
        """L2-normalised sentence embeddings `[batch, hidden]` float32, one per id list (each
        list already tokenised with its [CLS]/[SEP]). Sequences run together as one flat batch
        of rows, attention confined to each sequence; no padding, so nothing to mask."""
        hidden, seq_lens = self._hidden(token_id_lists, type_id_lists)
        return l2_normalise(self._pool(hidden, seq_lens))

    def classify(self, token_id_lists: Sequence[Sequence[int]], type_id_lists=None) -> np.ndarray:
        """Raw classification logits `[batch, num_labels]` float32 of each sequence (a pair
        as its tokenizer joins it, with its segment ids; None: all segment 0), from the head on
        its first token. Padding-free like `embed`: many short pairs make one flat batch."""
        if self.head is None:
            raise ValueError(f"{self.source.path}: this {self.hparams.arch} model has no classification head")
        be, head = self.backend, self.head
        hidden, seq_lens = self._hidden(token_id_lists, type_id_lists)
        starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int64)
        x = be.upload(np.ascontiguousarray(hidden[starts]))  # [batch, d]: each sequence's first token
        if head["dense"] is not None:
            x = be.softcap(be.matmul(x, head["dense"], head["dense_bias"]), 1.0)  # tanh(x) = 1 * tanh(x / 1)
        return be.read(be.matmul(x, head["out"], head["out_bias"])).astype(np.float32)

    def _hidden(self, token_id_lists, type_id_lists) -> tuple[np.ndarray, tuple[int, ...]]:
        """The last layer's rows `[n, d]` (read to the host) of the flat batch, and its lengths."""
        seq_lens = self._check(token_id_lists, type_id_lists)
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_id_lists])
        types = np.zeros_like(ids)
        if type_id_lists is not None:
            types = np.concatenate([np.asarray(t, dtype=np.int64) for t in type_id_lists])
        offset = self.config.position_offset
        positions = np.concatenate([np.arange(offset, offset + n, dtype=np.int64) for n in seq_lens])
        return self.backend.read(self._encode(ids, positions, types, seq_lens)), seq_lens

    def _check(self, token_id_lists, type_id_lists=None) -> tuple[int, ...]:
        hp = self.hparams
        if len(token_id_lists) == 0:
            raise ValueError("embed needs at least one sequence, got an empty batch")
        seq_lens = tuple(len(t) for t in token_id_lists)
        for i, n in enumerate(seq_lens):
            if not 0 < n <= self.max_len:
                raise ValueError(f"sequence {i} has {n} tokens; {hp.arch} takes 1..{self.max_len}")
        for i, ids in enumerate(token_id_lists):
            bad = [t for t in ids if not 0 <= int(t) < hp.vocab_size]
            if bad:
                raise ValueError(f"sequence {i} has token id {bad[0]} outside the vocabulary 0..{hp.vocab_size - 1}")
        if type_id_lists is not None:
            self._check_types(type_id_lists, seq_lens)
        return seq_lens

    def _check_types(self, type_id_lists, seq_lens: tuple[int, ...]) -> None:
        if len(type_id_lists) != len(seq_lens):
            raise ValueError(f"{len(type_id_lists)} segment id lists for {len(seq_lens)} sequences")
        for i, (types, n) in enumerate(zip(type_id_lists, seq_lens)):
            if len(types) != n:
                raise ValueError(f"sequence {i} has {n} tokens but {len(types)} segment ids")
            bad = [t for t in types if not 0 <= int(t) < self.num_token_types]
            if bad:
                raise ValueError(f"sequence {i} has segment id {bad[0]}; the model has {self.num_token_types} segments")

    def _encode(self, ids: np.ndarray, positions: np.ndarray, types: np.ndarray, seq_lens: tuple[int, ...]) -> Tensor:
        be, hp = self.backend, self.hparams
        h = be.add(be.embedding(self.word, ids), be.embedding(self.position, positions))
        h = be.add(h, be.embedding(self.token_types, types))
        h = be.layer_norm(h, *self.embd_norm, hp.norm_eps)
        for layer in self.layers:
            h = be.layer_norm(be.add(h, self._attention(layer, h, seq_lens)), *layer["attn_norm"], hp.norm_eps)
            ffn = be.act(be.matmul(h, layer["up"], layer["up_bias"]), "gelu")
            h = be.layer_norm(
                be.add(h, be.matmul(ffn, layer["down"], layer["down_bias"])), *layer["out_norm"], hp.norm_eps
            )
        return h  # [n, d]

    def _attention(self, layer: dict, x: Tensor, seq_lens: tuple[int, ...]) -> Tensor:
        be, hp = self.backend, self.hparams
        n, shape = sum(seq_lens), (sum(seq_lens), hp.num_heads, hp.head_dim)
        q = be.reshape(be.matmul(x, layer["q"], layer["q_bias"]), shape)
        k = be.reshape(be.matmul(x, layer["k"], layer["k_bias"]), shape)
        v = be.reshape(be.matmul(x, layer["v"], layer["v_bias"]), shape)
        out = be.attention_dense(q, k, v, seq_lens, self.scale)
        return be.matmul(be.reshape(out, (n, hp.num_heads * hp.head_dim)), layer["o"], layer["o_bias"])

    def _pool(self, hidden: np.ndarray, seq_lens: tuple[int, ...]) -> np.ndarray:
        """`[n, d]` rows grouped by sequence -> `[batch, d]` (host-side: the rows are read)."""
        starts = np.concatenate([[0], np.cumsum(seq_lens)[:-1]]).astype(np.int64)
        if self.pooling == "cls":
            return hidden[starts]
        if self.pooling == "last":
            return hidden[starts + np.asarray(seq_lens) - 1]
        return np.stack([hidden[s : s + n].mean(axis=0, dtype=np.float32) for s, n in zip(starts, seq_lens)])


def l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
