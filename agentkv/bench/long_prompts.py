"""The text prompts of `agentkv bench long`, built at the token level with the model's own
tokenizer and decoded to text (both servers take text): the tool loop of workloads.py, and
prompts of single-token words (workloads.WORDS), each from its own seed, so no two share a
prefix longer than chance and a fresh prompt never hits a cache."""

from __future__ import annotations

from typing import Any, NamedTuple

from agentkv.bench import workloads as wl

WARM_UP_SEED, TTFT_SEED, DECODE_SEED, STREAM_SEED = 41000, 42000, 43000, 44000
# The fleet's tool loop has its own seed: after the replay on the same server its prompts
# must not hit the replay's cached contexts.
REPLAY_SEED, FLEET_SEED = 11000, 12000
CONTEXT_SLACK = 128  # re-tokenized answer text may come out a few tokens longer than its ids


class Sizes(NamedTuple):
    """Every size the figures use (the command's flags)."""

    agents: int
    turns: int
    prefix: int
    user: int
    answer: int
    tool: int
    ttft_len: int
    depth_len: int  # tokens decoded after the TTFT prompt (decode speed at that depth)
    decode_len: int
    short_len: int  # the prompt before a decode and each of the concurrent streams
    streams: int

    def check(self) -> None:
        for name, value in self._asdict().items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} {value}: must be >= 1")


class Prompts(NamedTuple):
    """One model's prompts for the figures asked (the rest empty) and the context it needs."""

    warm_up: str
    segments: list[list[str]]  # [turn][agent] text appended before each request (replay)
    fleet: list[list[str]]  # the same for the fleet, from its own seed
    ttft: str
    decode: str
    streams: list[str]
    max_context: int  # longest prompt + answer any figure sends, plus slack


def words(chat: wl.ChatPieces, n: int, seed: int) -> str:
    """`n` single-token words, decoded to text (n tokens when tokenized again)."""
    ids = [chat.word_ids[i % len(chat.word_ids)] for i in wl.lcg(n, seed, 1 << 30)]
    return chat.tokenizer.decode(ids)


def tool_loop_text(tokenizer: Any, s: Sizes, seed: int = REPLAY_SEED) -> tuple[list[list[str]], int]:
    """workloads.tool_loop at these sizes, every segment as text; and its longest context."""
    workload = wl.tool_loop(
        tokenizer, agents=s.agents, turns=s.turns, prefix=s.prefix, answer=s.answer, tool=s.tool, user=s.user, seed=seed
    )
    segments = [[tokenizer.decode(seg) for seg in row] for row in workload.segments]
    longest = max(sum(len(row[a]) for row in workload.segments) for a in range(s.agents))
    return segments, longest + s.turns * s.answer


def build(model: str, figures: list[str], s: Sizes) -> Prompts:
    """The prompts of `figures` for `model` (loads its tokenizer only)."""
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(open_model(model))
    chat = wl.ChatPieces(tokenizer)
    segments, context = tool_loop_text(tokenizer, s) if "replay" in figures else ([], 0)
    fleet, fleet_context = tool_loop_text(tokenizer, s, FLEET_SEED) if "fleet" in figures else ([], 0)
    lens = [context, fleet_context, s.short_len + s.decode_len]
    if "ttft" in figures:
        lens.append(s.ttft_len + s.depth_len + 1)
    return Prompts(
        warm_up=words(chat, 16, WARM_UP_SEED),
        segments=segments,
        fleet=fleet,
        ttft=words(chat, s.ttft_len, TTFT_SEED) if "ttft" in figures else "",
        decode=words(chat, s.short_len, DECODE_SEED),
        streams=[words(chat, s.short_len, STREAM_SEED + i) for i in range(s.streams)] if "streams" in figures else [],
        max_context=max(lens) + CONTEXT_SLACK,
    )
