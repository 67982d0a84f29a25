"""Deterministic agent workloads (token level); the reuse accounting they are judged by is in accounting.py.

A workload is a grid of segments: agent `a` at turn `t` appends `segments[t][a]` to its own
context and sends the whole context. When `keep_answers` is set, the model's answer to the
turn (`max_tokens` greedy tokens, EOS ignored so every arm decodes the same count) is
appended too before the next segment, so the next prompt extends the previous prompt plus
answer token for token:

    turn t prompt:  | context before t | segments[t][a] |
    turn t+1:       | context before t | segments[t][a] | answer(t) | segments[t+1][a] |

Agents run turn-major: every agent's turn t, then turn t+1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentkv.bench.accounting import agentkv_expected_hits, agentkv_session_prefill, radixbench_reuse, session_formulas  # noqa: F401  (re-exported: the workloads' accounting)

LCG_BASE = 2463534242  # fak radixbench: s = 2463534242 + seed


def lcg(n: int, seed: int, vocab: int) -> list[int]:
    """fak radixbench's token generator: per id s = (s*1103515245 + 12345) & 0x7fffffff,
    id = s % vocab, from s = 2463534242 + seed."""
    s = LCG_BASE + seed
    out = []
    for _ in range(n):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(s % vocab)
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    """A named, parameterised, fully deterministic agent workload (see the module doc)."""

    name: str
    params: dict[str, Any]
    segments: list[list[list[int]]]  # [turn][agent] -> tokens appended before the request
    max_tokens: int  # answer length per request (1 = prompt-only)
    keep_answers: bool  # append each answer to the agent's context
    notes: str = ""
    formulas: dict[str, int] = field(default_factory=dict)  # closed-form expected counts

    @property
    def num_turns(self) -> int:
        return len(self.segments)

    @property
    def num_agents(self) -> int:
        return len(self.segments[0])


class Transcript:
    """The agents' growing contexts while a workload runs (mutated turn by turn)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.contexts: list[list[int]] = [[] for _ in range(workload.num_agents)]

    def prompts(self, turn: int) -> list[list[int]]:
        """Append turn `turn`'s segments (mutates) and return each agent's prompt (copies)."""
        for ctx, seg in zip(self.contexts, self.workload.segments[turn]):
            ctx.extend(seg)
        return [list(ctx) for ctx in self.contexts]

    def record(self, answers: Sequence[Sequence[int]]) -> None:
        """Append the turn's answers (mutates) when the workload keeps them."""
        if self.workload.keep_answers:
            for ctx, ans in zip(self.contexts, answers):
                ctx.extend(ans)


def all_prompts(
    workload: Workload, answers: Callable[[int, int], Sequence[int]] | None = None
) -> list[list[list[int]]]:
    """Every prompt, [turn][agent]; `answers(turn, agent)` supplies kept answers."""
    tr = Transcript(workload)
    out = []
    for t in range(workload.num_turns):
        prompts = tr.prompts(t)
        out.append(prompts)
        if workload.keep_answers:
            assert answers is not None, "a workload that keeps answers needs them"
            tr.record([answers(t, a) for a in range(workload.num_agents)])
    return out


# -- generators ---------------------------------------------------------------------------
def fak_agents(vocab: int = 49152, agents: int = 5, turns: int = 6, prefix: int = 128, append: int = 24) -> Workload:
    """fak radixbench's agents workload, prompt-only: a shared prefix lcg(128, 5001); agent a
    at turn t appends lcg(24, 5100 + 97a + t). Defaults: 6360 tokens, 5512 reusable."""
    segments = [
        [(lcg(prefix, 5001, vocab) if t == 0 else []) + lcg(append, 5100 + 97 * a + t, vocab) for a in range(agents)]
        for t in range(turns)
    ]
    params = dict(vocab=vocab, agents=agents, turns=turns, prefix=prefix, append=append)
    return Workload(
        "fak-agents",
        params,
        segments,
        max_tokens=1,
        keep_answers=False,
        notes="radixbench lcg tokens; prompt-only (max_tokens=1, answers dropped)",
    )


@dataclass(frozen=True, slots=True)
class SessionShape:
    """The session workload's sizes: `agents` contexts of `turns` turns; turn 0 = a shared
    prefix (`prefix` tokens) + a per-agent task (`user`); each later turn = the previous
    answer (`answer` greedy tokens, kept) + a tool result (`tool` tokens)."""

    agents: int = 8
    turns: int = 10
    prefix: int = 1024
    user: int = 64
    answer: int = 64
    tool: int = 256
    seed: int = 7000
    vocab: int = 49152

    def __post_init__(self) -> None:
        for name in ("agents", "turns", "answer", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"session {name}={getattr(self, name)}: must be >= 1")
        for name in ("prefix", "user", "tool", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"session {name}={getattr(self, name)}: must be >= 0")


def session(name: str = "session", **sizes: int) -> Workload:
    """lcg tokens in the session shape (`sizes` are SessionShape's fields)."""
    known = SessionShape.__dataclass_fields__
    for key in sizes:
        if key not in known:
            raise ValueError(f"{name}: unknown size {key!r}; choose from {', '.join(known)}")
    return session_workload(SessionShape(**sizes), name)


def session_workload(shape: SessionShape, name: str = "session") -> Workload:
    """The session workload of `shape` (see SessionShape)."""
    s = shape
    shared = lcg(s.prefix, s.seed, s.vocab)
    segments = [[shared + lcg(s.user, s.seed + 1000 + a, s.vocab) for a in range(s.agents)]]
    segments += [
        [lcg(s.tool, s.seed + 10000 + 97 * a + t, s.vocab) for a in range(s.agents)] for t in range(1, s.turns)
    ]
    params = dict(
        agents=s.agents,
        turns=s.turns,
        prefix=s.prefix,
        user=s.user,
        answer=s.answer,
        tool=s.tool,
        seed=s.seed,
        vocab=s.vocab,
    )
    formulas = session_formulas(s.prefix, s.turns, s.agents, s.answer, s.tool, s.user)
    formulas["agentkv_exact"] = agentkv_session_prefill(s.prefix, s.turns, s.agents, s.answer, s.tool, s.user)
    return Workload(
        name,
        params,
        segments,
        max_tokens=s.answer,
        keep_answers=True,
        notes="lcg tokens; greedy answers kept in the context",
        formulas=formulas,
    )


def multi_turn(
    conversations: int = 3,
    turns: int = 4,
    prefix: int = 128,
    user: int = 48,
    answer: int = 16,
    seed: int = 8000,
    vocab: int = 49152,
) -> Workload:
    """vLLM's multi-turn shape (benchmark_serving_multi_turn), scaled down: conversations
    share a common prefix; each turn adds a user message and the model's answer."""
    wl = session_workload(SessionShape(conversations, turns, prefix, user, answer, user, seed, vocab), "multi-turn")
    params = dict(
        conversations=conversations, turns=turns, prefix=prefix, user=user, answer=answer, seed=seed, vocab=vocab
    )
    return Workload(
        "multi-turn",
        params,
        wl.segments,
        wl.max_tokens,
        True,
        "vLLM multi-turn shape, lcg tokens, scaled down for 2 cores",
        wl.formulas,
    )


def shared_prefix(
    groups: int = 2,
    prompts_per_group: int = 4,
    system_len: int = 256,
    question_len: int = 32,
    output_len: int = 16,
    seed: int = 9000,
    vocab: int = 49152,
) -> Workload:
    """SGLang's generated-shared-prefix shape (bench_serving gsp), scaled down: `groups`
    system prompts, each followed by `prompts_per_group` questions, all sent at once."""
    row = []
    for g in range(groups):
        system = lcg(system_len, seed + g, vocab)
        row += [
            system + lcg(question_len, seed + 1000 + g * prompts_per_group + q, vocab) for q in range(prompts_per_group)
        ]
    params = dict(
        groups=groups,
        prompts_per_group=prompts_per_group,
        system_len=system_len,
        question_len=question_len,
        output_len=output_len,
        seed=seed,
        vocab=vocab,
    )
    n = groups * prompts_per_group
    formulas = {"naive": n * (system_len + question_len), "shared_prefix": groups * system_len + n * question_len}
    return Workload(
        "shared-prefix",
        params,
        [row],
        max_tokens=output_len,
        keep_answers=False,
        notes="SGLang gsp shape, lcg tokens, one wave",
        formulas=formulas,
    )


# -- tool-loop: chat-templated turns built at the token level -----------------------------
WORDS = (
    "tool search query file read write result status error path line value table name "
    "type list call return data user agent task plan step next done check test run open "
    "close time date code note item page text word key map link node edge graph cache "
    "block token model input output answer question system report city weather price "
    "stock order ticket issue branch commit build deploy server client request"
).split()


class ChatPieces:
    """Token pieces of a ChatML transcript (SmolLM2's template), cut at special tokens so
    concatenating them equals tokenizing the rendered text (tests check the round trip)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        self.words = [w for w in WORDS if len(enc(" " + w)) == 1]
        self.word_ids = [enc(" " + w)[0] for w in self.words]
        self.end = enc("<|im_end|>\n")
        self.header = {r: enc(f"<|im_start|>{r}\n") for r in ("system", "user", "tool", "assistant")}

    def message(self, role: str, n_tokens: int, seed: int, lead: list[int] = (), trail: list[int] = ()) -> list[int]:
        """`lead` + one `role` message of word tokens + `trail`, exactly `n_tokens` long."""
        fixed = list(lead) + self.header[role] + self.end + list(trail)
        if n_tokens <= len(fixed):
            raise ValueError(
                f"a {role} message of {n_tokens} tokens is too short: the template alone takes {len(fixed)}"
            )
        body = [self.word_ids[i % len(self.word_ids)] for i in lcg(n_tokens - len(fixed), seed, 1 << 30)]
        return list(lead) + self.header[role] + body + self.end + list(trail)


def tool_loop(
    tokenizer: Any,
    agents: int = 5,
    turns: int = 10,
    prefix: int = 1024,
    answer: int = 32,
    tool: int = 128,
    user: int = 64,
    seed: int = 11000,
) -> Workload:
    """A agents share a system prompt with a tool table (`prefix` tokens); agent a's turn 0
    adds its task (a user message of `user` tokens, ending in the assistant header); each
    later turn closes the previous answer and adds a tool result, `tool` tokens in all:

        | system (P) | user task (U) | answer (D) | <|im_end|>\\n tool msg <|im_start|>assistant\\n (R) | ...
    """
    chat = ChatPieces(tokenizer)
    gen = chat.header["assistant"]
    system = chat.message("system", prefix, seed)
    segments = [[system + chat.message("user", user, seed + 1 + a, trail=gen) for a in range(agents)]]
    segments += [
        [chat.message("tool", tool, seed + 100 + 97 * a + t, lead=chat.end, trail=gen) for a in range(agents)]
        for t in range(1, turns)
    ]
    params = dict(
        agents=agents,
        turns=turns,
        prefix=prefix,
        answer=answer,
        tool=tool,
        user=user,
        seed=seed,
        template="chatml (SmolLM2)",
    )
    formulas = session_formulas(prefix, turns, agents, answer, tool, user)
    # The user header ("<|im_start|>user\n") is shared too; chance coincidences of the first
    # words are not in the closed form (the per-request prediction has them).
    h = len(chat.header["user"])
    formulas["agentkv_exact"] = agentkv_session_prefill(prefix + h, turns, agents, answer, tool, user - h)
    return Workload(
        "tool-loop",
        params,
        segments,
        max_tokens=answer,
        keep_answers=True,
        notes="ChatML turns (system + tool table, user task, greedy answer, tool result) built at the token level",
        formulas=formulas,
    )


# name -> (defaults, --quick overrides); every generator's keyword arguments are its params.
WORKLOADS: dict[str, tuple[Callable[..., Workload], dict, dict]] = {
    "fak-agents": (fak_agents, {}, {}),
    "tool-loop": (tool_loop, {}, dict(agents=2, turns=3, prefix=96, answer=8, tool=32, user=24)),
    "shared-prefix": (
        shared_prefix,
        {},
        dict(groups=2, prompts_per_group=2, system_len=64, question_len=8, output_len=4),
    ),
    "multi-turn": (multi_turn, {}, dict(conversations=2, turns=3, prefix=48, user=16, answer=4)),
    "session": (session, {}, dict(agents=2, turns=3, prefix=64, user=16, answer=8, tool=16)),
}


def build(name: str, tokenizer: Any = None, quick: bool = False, **overrides: Any) -> Workload:
    """The named workload with its defaults, the --quick sizes, then `overrides` applied."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    factory, defaults, small = WORKLOADS[name]
    kw = {**defaults, **(small if quick else {}), **overrides}
    if factory is tool_loop:
        if tokenizer is None:
            raise ValueError("the tool-loop workload needs the model's tokenizer")
        return factory(tokenizer, **kw)
    return factory(**kw)
