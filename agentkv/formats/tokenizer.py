"""Tokenizers built from a GGUF's embedded vocabulary (`gguf_vocab`) or a tokenizer.json, and
streaming decode that never emits half a character."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend

from agentkv.formats.errors import TokenizerError
from agentkv.formats.gguf_vocab import (
    BYTE_TOKEN,
    EOG_SPELLINGS,
    add_typed_tokens,
    byte_level_backend,
    sentencepiece_backend,
    set_bos_eos,
    token_name,
)


class Tokenizer:
    """Text <-> token ids for one model. Immutable after construction; thread-safe for reads."""

    def __init__(
        self,
        backend: _Backend,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        unk_id: int | None = None,
        eot_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        origin: str = "<memory>",
    ) -> None:
        self.backend = backend
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.origin = origin
        self._vocab_size = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        self.eos_ids: frozenset[int] = frozenset(i for i in (eos_id, *eot_ids) if i is not None)
        added = backend.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(
            [i for i, tok in added.items() if tok.special]
            + [i for i in (bos_id, eos_id, pad_id, unk_id) if i is not None]
        )

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any], path: Any) -> Tokenizer:
        """Build from GGUF key/values (as gguf-py's `ReaderField.contents()` gives them);
        `path` only names the file in errors."""
        model = metadata.get("tokenizer.ggml.model")
        if "tokenizer.ggml.tokens" not in metadata:
            raise TokenizerError(f"{path}: tokenizer.ggml.tokens is missing; the file has no vocabulary")
        if model == "gpt2":
            backend = byte_level_backend(metadata, path)
        elif model == "llama":
            backend = sentencepiece_backend(metadata, path)
        else:
            raise TokenizerError(
                f"{path}: tokenizer.ggml.model = {model!r} is not supported; supported: ['gpt2', 'llama']"
            )
        add_typed_tokens(backend, metadata)
        tokens = metadata["tokenizer.ggml.tokens"]
        ids = {
            role: metadata.get(f"tokenizer.ggml.{key}")
            for role, key in (
                ("bos", "bos_token_id"),
                ("eos", "eos_token_id"),
                ("pad", "padding_token_id"),
                ("unk", "unknown_token_id"),
            )
        }
        for role, i in ids.items():
            if i is not None and not 0 <= i < len(tokens):
                raise TokenizerError(
                    f"{path}: tokenizer.ggml.{role} id = {i} is outside the vocabulary [0, {len(tokens)})"
                )
        name = {role: (tokens[i] if i is not None else None) for role, i in ids.items()}
        add_bos = metadata.get("tokenizer.ggml.add_bos_token", model == "llama")
        add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
        set_bos_eos(backend, name["bos"], ids["bos"], name["eos"], ids["eos"], bool(add_bos), bool(add_eos))
        eot = [metadata.get(k) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")]
        eot += [i for i, t in enumerate(tokens) if t in EOG_SPELLINGS]
        return cls(
            backend,
            bos_id=ids["bos"],
            eos_id=ids["eos"],
            pad_id=ids["pad"],
            unk_id=ids["unk"],
            eot_ids=[i for i in eot if i is not None],
            vocab_size=len(tokens),
            origin=str(path),
        )

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        tokenizer_config: dict[str, Any] | None = None,
        model_config: dict[str, Any] | None = None,
    ) -> Tokenizer:
        """Load a `tokenizer.json` (or a folder holding one). Special-token roles come from
        `tokenizer_config` (default: the folder's tokenizer_config.json) and eos ids from
        `model_config` (config.json's `eos_token_id`, an int or a list)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerError(f"{file}: no tokenizer.json there")
        try:
            backend = _Backend.from_file(str(file))
        except Exception as exc:
            raise TokenizerError(f"{file}: cannot be read as a tokenizer.json: {exc}") from exc
        # A file may ask for padding/truncation to a fixed length (MiniLM pads to 128); the engine
        # needs the raw ids, as HF's tokenizer gives them unless asked otherwise.
        backend.no_padding()
        backend.no_truncation()
        if tokenizer_config is None:
            cfg_file = file.parent / "tokenizer_config.json"
            tokenizer_config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        role_ids = {}
        for role in ("bos", "eos", "pad", "unk"):
            tok = token_name(tokenizer_config.get(f"{role}_token"))
            role_ids[role] = backend.token_to_id(tok) if tok is not None else None
        extra = (model_config or {}).get("eos_token_id")
        eot = extra if isinstance(extra, list) else [extra]
        vocab = backend.get_vocab(with_added_tokens=True)
        eot += [i for t, i in vocab.items() if t in EOG_SPELLINGS]
        return cls(
            backend,
            bos_id=role_ids["bos"],
            eos_id=role_ids["eos"],
            pad_id=role_ids["pad"],
            unk_id=role_ids["unk"],
            eot_ids=[i for i in eot if i is not None],
            origin=str(file),
        )

    @functools.cached_property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of byte-fallback tokens (`<0x41>`); empty for byte-level vocabularies."""
        if not getattr(self.backend.model, "byte_fallback", False):
            return frozenset()
        vocab = self.backend.get_vocab(with_added_tokens=False)
        return frozenset(i for tok, i in vocab.items() if BYTE_TOKEN.fullmatch(tok))

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding: the largest valid id plus one."""
        return self._vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS (and EOS) are added only when the model asks for them."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, text: str, pair: str) -> tuple[list[int], list[int]]:
        """(token ids, segment ids) of a text pair as the tokenizer's own pair template joins
        them (BERT: `[CLS] a [SEP] b [SEP]`, segments 0 then 1; RoBERTa: `<s> a </s></s> b </s>`)."""
        enc = self.backend.encode(text, pair, add_special_tokens=True)
        return enc.ids, enc.type_ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; bytes of an unfinished UTF-8 character decode as U+FFFD."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def _name(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.id_to_token(token_id)

    @property
    def bos_token(self) -> str | None:
        return self._name(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return self._name(self.eos_id)

    @property
    def pad_token(self) -> str | None:
        return self._name(self.pad_id)

    @property
    def unk_token(self) -> str | None:
        return self._name(self.unk_id)


class IncrementalDecoder:
    """Streams text one token at a time without ever emitting half a UTF-8 character.

    Mutable; one per request. Decodes a sliding window of ids so each push costs O(window):

        ids:  [ ... emitted ... | prefix_offset ... read_offset | new ids ]
                                 \\_ context, already emitted _/ \\_ text to emit _/

    Text whose window ends in U+FFFD is held back until the character completes, and so is a
    run of byte-fallback tokens: the decoder turns a whole run that is not valid UTF-8 into
    U+FFFDs, so a byte already emitted could change. `flush()` returns whatever is still held.
    The concatenation of all pieces equals `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _window_texts(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        window = self.ids[self._prefix_offset :]
        done = decode(self.ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        return done, decode(window, self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one id; returns the newly completed text (possibly empty). Mutates the decoder."""
        self.ids.append(token_id)
        if token_id in self.tokenizer.byte_token_ids:
            return ""
        done, text = self._window_texts()
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return text[len(done) :]

    def flush(self) -> str:
        """The text still held back (e.g. an unfinished character at the end of the stream)."""
        done, text = self._window_texts()
        self._prefix_offset = self._read_offset = len(self.ids)
        return text[len(done) :]


def load_tokenizer(source: Any) -> Tokenizer:
    """The tokenizer of a `ModelSource`: from GGUF metadata, or the folder's tokenizer.json."""
    if source.kind == "gguf":
        return Tokenizer.from_gguf_metadata(source.metadata, source.path)
    if source.kind == "safetensors":
        config = dict(source.metadata)
        return Tokenizer.from_file(Path(source.path), config.pop("tokenizer_config", None), config)
    raise TokenizerError(f"{source.path}: no tokenizer for a source of kind {source.kind!r}")
