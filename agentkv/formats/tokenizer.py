"""Tokenizers built from a GGUF's embedded vocabulary or a tokenizer.json, and streaming decode.

Two GGUF vocabularies are rebuilt on the `tokenizers` library, the same way transformers'
GGUF converter (`integrations/gguf/gguf_tokenizer_mapping.py`) does, so ids match HF:

    tokenizer.ggml.model  | model                          | text -> pieces
    ----------------------+--------------------------------+-------------------------------------
    "gpt2"                | BPE over the byte alphabet,    | split regex chosen by
                          | merges from the file           | `tokenizer.ggml.pre`, then ByteLevel
    "llama" (gemma*)      | BPE + byte fallback, merges    | " " -> "▁", no prefix space
                          | rebuilt from token order       |
    "llama" (others)      | BPE + byte fallback, merges    | Metaspace, prefix space iff
                          | rebuilt from the scores        | `tokenizer.ggml.add_space_prefix`

Tokens typed CONTROL (3) become special added tokens and USER_DEFINED (4) plain added tokens,
so both match whole when they appear in text.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterable

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from agentkv.formats.errors import TokenizerError

CONTROL, USER_DEFINED = 3, 4
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# llama.cpp's end-of-generation spellings (llama-vocab.cpp): a turn ends on any of them.
_EOG_SPELLINGS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<end_of_turn>",
    "<｜end▁of▁sentence｜>",
})

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PRES = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
                    _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _GPT4O_SPLIT),
}
# llama.cpp splits every digit first for these, then applies the GPT-2 regex.
_DIGIT_PRES = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
_GPT2_PRES = frozenset({"default", "gpt-2", "gpt2"})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the alphabet byte-level vocabularies use)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + extra)
            extra += 1
    return spelled


def _byte_level_pre_tokenizer(pre: str, path: Any) -> pre_tokenizers.PreTokenizer:
    if pre in _SPLIT_PRES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PRES[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if pre in _DIGIT_PRES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    if pre in _GPT2_PRES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    known = sorted({*_SPLIT_PRES, *_DIGIT_PRES, *_GPT2_PRES})
    raise TokenizerError(f"{path}: tokenizer.ggml.pre = {pre!r} is not a known pre-tokenizer; known: {known}")


def _byte_level_backend(meta: dict[str, Any], path: Any) -> _Backend:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise TokenizerError(f"{path}: tokenizer.ggml.merges is missing; a 'gpt2' vocabulary needs it")
    pairs = [tuple(m.split(" ")) for m in merges]
    backend = _Backend(BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"), path)
    backend.decoder = decoders.ByteLevel()
    return backend


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a vocabulary: every split of a token into two known tokens, best score
    first (transformers' `generate_merges`, whose order the HF oracle uses)."""
    merges = []
    for merge, score in scores.items():
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece_backend(meta: dict[str, Any], path: Any) -> _Backend:
    tokens = list(meta["tokenizer.ggml.tokens"])
    arch = meta.get("general.architecture", "")
    gemma = arch.startswith("gemma")
    if gemma:
        # Gemma stores runs of spaces as real spaces but looks them up as "▁▁"; its scores do not
        # follow its merge order, the position in the file does.
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        ranks = {tok: -i for i, tok in enumerate(tokens)}
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError(f"{path}: tokenizer.ggml.scores is missing; a 'llama' vocabulary needs it")
        ranks = dict(zip(tokens, scores))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = ([tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
              if "tokenizer.ggml.merges" in meta else generate_merges(vocab, ranks))
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    backend = _Backend(BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    elif arch == "phi3":
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        steps.append(decoders.Strip(content=" ", left=1))
    else:
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False)
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _add_typed_tokens(backend: _Backend, meta: dict[str, Any]) -> None:
    """CONTROL tokens become special added tokens, USER_DEFINED plain ones; only spellings the
    vocabulary holds, so no id past the model's embedding is ever created."""
    vocab = backend.get_vocab(with_added_tokens=False)
    typed = list(zip(meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or ()))
    control = [AddedToken(t, normalized=False, special=True) for t, k in typed if k == CONTROL and t in vocab]
    user = [AddedToken(t, normalized=False, special=False) for t, k in typed if k == USER_DEFINED and t in vocab]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def _set_bos_eos(backend: _Backend, bos: str | None, bos_id: int | None,
                 eos: str | None, eos_id: int | None, add_bos: bool, add_eos: bool) -> None:
    """Install the post-processor that adds BOS/EOS on `encode(..., add_special_tokens=True)`."""
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    if not (add_bos or add_eos):
        return

    def side(seq: str, type_id: int) -> str:
        head = f"{bos}:{type_id} " if add_bos else ""
        tail = f" {eos}:{type_id}" if add_eos else ""
        return f"{head}{seq}:{type_id}{tail}"

    specials = ([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos and eos != bos else [])
    backend.post_processor = processors.TemplateProcessing(
        single=side("$A", 0), pair=f"{side('$A', 0)} {side('$B', 1)}",
        special_tokens=specials)


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    """Text <-> token ids for one model. Immutable after construction; thread-safe for reads."""

    def __init__(self, backend: _Backend, *, bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None, eot_ids: Iterable[int] = (),
                 vocab_size: int | None = None, origin: str = "<memory>") -> None:
        self.backend = backend
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.origin = origin
        self._vocab_size = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        self.eos_ids: frozenset[int] = frozenset(
            i for i in (eos_id, *eot_ids) if i is not None)
        added = backend.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(
            [i for i, tok in added.items() if tok.special]
            + [i for i in (bos_id, eos_id, pad_id, unk_id) if i is not None])

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any], path: Any) -> Tokenizer:
        """Build from GGUF key/values (as gguf-py's `ReaderField.contents()` gives them);
        `path` only names the file in errors."""
        model = metadata.get("tokenizer.ggml.model")
        if "tokenizer.ggml.tokens" not in metadata:
            raise TokenizerError(f"{path}: tokenizer.ggml.tokens is missing; the file has no vocabulary")
        if model == "gpt2":
            backend = _byte_level_backend(metadata, path)
        elif model == "llama":
            backend = _sentencepiece_backend(metadata, path)
        else:
            raise TokenizerError(f"{path}: tokenizer.ggml.model = {model!r} is not supported; "
                                 f"supported: ['gpt2', 'llama']")
        _add_typed_tokens(backend, metadata)
        tokens = metadata["tokenizer.ggml.tokens"]
        ids = {role: metadata.get(f"tokenizer.ggml.{key}") for role, key in (
            ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
            ("unk", "unknown_token_id"))}
        for role, i in ids.items():
            if i is not None and not 0 <= i < len(tokens):
                raise TokenizerError(f"{path}: tokenizer.ggml.{role} id = {i} is outside the vocabulary "
                                     f"[0, {len(tokens)})")
        name = {role: (tokens[i] if i is not None else None) for role, i in ids.items()}
        add_bos = metadata.get("tokenizer.ggml.add_bos_token", model == "llama")
        add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
        _set_bos_eos(backend, name["bos"], ids["bos"], name["eos"], ids["eos"], bool(add_bos), bool(add_eos))
        eot = [metadata.get(k) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")]
        eot += [i for i, t in enumerate(tokens) if t in _EOG_SPELLINGS]
        return cls(backend, bos_id=ids["bos"], eos_id=ids["eos"], pad_id=ids["pad"], unk_id=ids["unk"],
                   eot_ids=[i for i in eot if i is not None], vocab_size=len(tokens), origin=str(path))

    @classmethod
    def from_file(cls, path: str | Path, tokenizer_config: dict[str, Any] | None = None,
                  model_config: dict[str, Any] | None = None) -> Tokenizer:
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
            tok = _token_name(tokenizer_config.get(f"{role}_token"))
            role_ids[role] = backend.token_to_id(tok) if tok is not None else None
        extra = (model_config or {}).get("eos_token_id")
        eot = extra if isinstance(extra, list) else [extra]
        vocab = backend.get_vocab(with_added_tokens=True)
        eot += [i for t, i in vocab.items() if t in _EOG_SPELLINGS]
        return cls(backend, bos_id=role_ids["bos"], eos_id=role_ids["eos"], pad_id=role_ids["pad"],
                   unk_id=role_ids["unk"], eot_ids=[i for i in eot if i is not None], origin=str(file))

    @functools.cached_property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of byte-fallback tokens (`<0x41>`); empty for byte-level vocabularies."""
        if not getattr(self.backend.model, "byte_fallback", False):
            return frozenset()
        vocab = self.backend.get_vocab(with_added_tokens=False)
        return frozenset(i for tok, i in vocab.items() if _BYTE_TOKEN.fullmatch(tok))

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding: the largest valid id plus one."""
        return self._vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS (and EOS) are added only when the model asks for them."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

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
    U+FFFDs, so a byte already emitted could change. `flush()` returns whatever is still held. The concatenation of all pieces equals `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _window_texts(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        window = self.ids[self._prefix_offset:]
        done = decode(self.ids[self._prefix_offset:self._read_offset], self.skip_special_tokens)
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
        return text[len(done):]

    def flush(self) -> str:
        """The text still held back (e.g. an unfinished character at the end of the stream)."""
        done, text = self._window_texts()
        self._prefix_offset = self._read_offset = len(self.ids)
        return text[len(done):]


def load_tokenizer(source: Any) -> Tokenizer:
    """The tokenizer of a `ModelSource`: from GGUF metadata, or the folder's tokenizer.json."""
    if source.kind == "gguf":
        return Tokenizer.from_gguf_metadata(source.metadata, source.path)
    if source.kind == "safetensors":
        config = dict(source.metadata)
        return Tokenizer.from_file(Path(source.path), config.pop("tokenizer_config", None), config)
    raise TokenizerError(f"{source.path}: no tokenizer for a source of kind {source.kind!r}")
