"""A GGUF's embedded vocabulary rebuilt on the `tokenizers` library, the same way transformers'
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

import re
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from agentkv.formats.errors import TokenizerError

CONTROL, USER_DEFINED = 3, 4
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# llama.cpp's end-of-generation spellings (llama-vocab.cpp): a turn ends on any of them.
EOG_SPELLINGS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<end_of_turn>",
        "<｜end▁of▁sentence｜>",
    }
)

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
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
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
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRES[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in _DIGIT_PRES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _GPT2_PRES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    known = sorted({*_SPLIT_PRES, *_DIGIT_PRES, *_GPT2_PRES})
    raise TokenizerError(f"{path}: tokenizer.ggml.pre = {pre!r} is not a known pre-tokenizer; known: {known}")


def byte_level_backend(meta: dict[str, Any], path: Any) -> _Backend:
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
        local = [
            (merge[:k], merge[k:], score) for k in range(1, len(merge)) if merge[:k] in vocab and merge[k:] in vocab
        ]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def sentencepiece_backend(meta: dict[str, Any], path: Any) -> _Backend:
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
    merges = (
        [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
        if "tokenizer.ggml.merges" in meta
        else generate_merges(vocab, ranks)
    )
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
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False
        )
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def add_typed_tokens(backend: _Backend, meta: dict[str, Any]) -> None:
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


def set_bos_eos(
    backend: _Backend,
    bos: str | None,
    bos_id: int | None,
    eos: str | None,
    eos_id: int | None,
    add_bos: bool,
    add_eos: bool,
) -> None:
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
        single=side("$A", 0), pair=f"{side('$A', 0)} {side('$B', 1)}", special_tokens=specials
    )


def token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value
