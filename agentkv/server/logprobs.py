"""Engine TokenLogprobs -> the two OpenAI shapes: chat's `logprobs.content` entries and the
legacy completions `logprobs` (tokens / token_logprobs / top_logprobs / text_offset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentkv.server.responses import ChoiceLogprobs, CompletionLogprobs, TokenLogprobEntry, TopLogprob


class TokenText:
    """Token id -> its text, cached (decoding one id at a time is what both shapes need)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text

    def tokenizer_decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids))


def _finite(x: float) -> float:
    return x if x > -1e30 else -9999.0  # JSON has no -inf; OpenAI clamps the same way


def chat_logprobs(entries: Sequence[Any], text_of: TokenText) -> ChoiceLogprobs:
    content = []
    for entry in entries:
        token = text_of(entry.token_id)
        top = [
            TopLogprob(token=text_of(i), logprob=_finite(lp), bytes=list(text_of(i).encode())) for i, lp in entry.top
        ]
        content.append(
            TokenLogprobEntry(token=token, logprob=_finite(entry.logprob), bytes=list(token.encode()), top_logprobs=top)
        )
    return ChoiceLogprobs(content=content)


def completion_logprobs(
    entries: Sequence[Any | None],
    token_ids: Sequence[int],
    text_of: TokenText,
    *,
    start_offset: int = 0,
    into: CompletionLogprobs | None = None,
) -> CompletionLogprobs:
    """Append `entries` (None for a token with no logprob, e.g. the first prompt token) to
    `into`; text offsets continue from `start_offset` (or from where `into` stopped)."""
    out = into or CompletionLogprobs()
    offset = start_offset
    if out.text_offset:
        offset = out.text_offset[-1] + len(out.tokens[-1])
    for token_id, entry in zip(token_ids, entries):
        token = text_of(token_id)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if entry is None:
            # The first prompt token has no context, so no logprob: null, as OpenAI and vLLM
            # send it (the openai SDK parses it; only its strict validation, whose type says
            # floats, refuses it).
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_finite(entry.logprob))
        top: dict[str, float] = {}
        for i, lp in entry.top:
            top.setdefault(text_of(i), _finite(lp))
        out.top_logprobs.append(top)
    return out
