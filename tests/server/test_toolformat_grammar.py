"""Constrained calls in each family's own syntax: the grammar a format gives (compiled by
xgrammar over a byte-level vocabulary with the families' special tokens) is walked with
random choices among the allowed tokens, and what it generates always parses back into one
call of the chosen tool with arguments valid against its schema."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from agentkv.formats.tokenizer import Tokenizer
from agentkv.runtime.structured import ConstraintFactory
from agentkv.server.toolformats import FORMATS, ParseContext, get_format, parse_whole
from agentkv.server.toolformats.registry import MARKER_TOKENS

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "São Paulo"]},
        "days": {"type": "integer", "minimum": 0, "maximum": 9},
        "metric": {"type": "boolean"},
        # xgrammar's JSON strings admit raw control characters (\x00-\x1f but \r\n), which
        # strict JSON readers refuse; a random walk finds them, a trained model does not write them.
        "note": {"type": "string", "pattern": "[a-z<&>]{1,6}"},
    },
    "required": ["city", "days", "metric", "note"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Backend(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in sorted(MARKER_TOKENS)])
    folder = tmp_path_factory.mktemp("bytes")
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text("{}")
    tokenizer = Tokenizer.from_file(folder / "tokenizer.json")
    return tokenizer, ConstraintFactory(tokenizer, 256 + len(MARKER_TOKENS), MARKER_TOKENS)


def _walk(constraint, rng, prefer_special: bool, closers: tuple[int, ...] = ()) -> list[int]:
    """Random allowed tokens until the grammar ends; `closers` (the ids of "<" and "\n", first allowed first) are
    taken half the time they are allowed, so free-text values end."""
    ids: list[int] = []
    while not constraint.is_finished() and len(ids) < 400:
        allowed = np.flatnonzero(constraint.allowed_mask())
        special = allowed[allowed >= 256]
        # Where the grammar spells a marker (few choices), take its special token.
        marker = prefer_special and len(special) and len(allowed) < 30
        token = int(special[0]) if marker else int(rng.choice(allowed))
        ends = [c for c in closers if c in set(allowed.tolist())]
        if ends and rng.random() < 0.5:
            token = ends[0]
        ids.append(token)
        constraint.accept(token)
    assert constraint.is_finished(), "the grammar did not end"
    return ids


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_constrained_call_always_parses(factory, name, seed):
    tokenizer, build = factory
    fmt = get_format(name)
    rng = np.random.default_rng(seed)
    closers = tuple(tokenizer.encode("<", False) + tokenizer.encode("\n", False))
    constraint = build.call_grammar(fmt.grammar(TOOLS[:1]), 1)
    text = tokenizer.decode(_walk(constraint, rng, prefer_special=seed == 0, closers=closers))
    content, calls = parse_whole(fmt, text, ParseContext.of_tools(TOOLS))
    assert content.strip() == "" and [c.name for c in calls] == ["get_weather"], text
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "mistral", "deepseek_v31", "kimi_k2", "glm45"])
def test_one_or_more_calls_parse_in_order(factory, name):
    tokenizer, build = factory
    fmt = get_format(name)
    constraint = build.call_grammar(fmt.grammar(TOOLS), 3)
    text = tokenizer.decode(_walk_to_calls(constraint, np.random.default_rng(5)))
    _, calls = parse_whole(fmt, text, ParseContext.of_tools(TOOLS))
    assert 1 <= len(calls) <= 3, text
    for call in calls:
        schema = SCHEMA if call.name == "get_weather" else TOOLS[1]["function"]["parameters"]
        jsonschema.validate(json.loads(call.arguments), schema)


def _walk_to_calls(constraint, rng) -> list[int]:
    """A grammar of 1..N calls ends on EOS (the model decides); walk until EOS is allowed."""
    ids: list[int] = []
    while len(ids) < 1200:
        mask = constraint.allowed_mask()
        allowed = np.flatnonzero(mask)
        if not len(allowed) or constraint.is_finished():
            break
        token = int(rng.choice(allowed))
        ids.append(token)
        constraint.accept(token)
        if constraint.is_finished():
            break
    return ids


@pytest.mark.parametrize("parallel", [None, True])
def test_a_named_choice_is_exactly_one_call(factory, parallel):
    """OpenAI: a named tool_choice calls "exactly one specific function". The grammar used to
    allow up to four calls ended by EOS (parallel_tool_calls defaults to true), and SmolLM2
    streamed three identical calls; now it ends itself after one."""
    from agentkv.server.tool_policy import constraint_builder, tool_policy

    tokenizer, build = factory
    policy = tool_policy(TOOLS, {"type": "function", "function": {"name": "noop"}}, parallel)
    assert policy.max_calls == 1 and policy.grammar_calls() == 1
    constraint = constraint_builder(policy, None, get_format("hermes"))(build)
    text = tokenizer.decode(_walk(constraint, np.random.default_rng(3), prefer_special=True))
    assert text == '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    # Control: "required" with parallel calls may go on after the first call (ends on EOS).
    required = tool_policy(TOOLS, "required", parallel)
    assert required.max_calls is None and required.grammar_calls() > 1


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_strict_call_under_auto_parses_once_begun(factory, name):
    """`strict` tools under auto: text stays free (a word the grammar could never write is
    accepted), and once the text opens a call -- the format's marker, its section's marker or,
    where it has none, the call's head -- the rest is held to the family's grammar, so a random
    walk from there always parses into a schema-valid call. Control: the same walk unconstrained
    parses into nothing."""
    from agentkv.server.tool_policy import constraint_builder, tool_policy

    tokenizer, build = factory
    fmt = get_format(name)
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    constraint = constraint_builder(tool_policy(strict, "auto", False), None, fmt)(build)
    triggers, tags = fmt.strict_calls(strict)
    opener = tags[-1][0] if name == "pythonic" else tags[0][0][: max(len(t) for t in triggers)]
    prefix = ("" if name in ("llama3_json", "pythonic") else "Let me see. ") + opener
    ids = tokenizer.encode(prefix, False)
    for token in ids:
        assert constraint.allowed_mask()[token], (prefix, token)
        constraint.accept(token)
    rng = np.random.default_rng(11)
    closers = tuple(tokenizer.encode("<", False) + tokenizer.encode("\n", False))
    ids += _walk_until_call(constraint, rng, closers)
    text = tokenizer.decode(ids)
    known = ParseContext.of_tools(strict, frozenset({"get_weather"}))
    _, calls = parse_whole(fmt, text, known)
    assert calls and {c.name for c in calls} == {"get_weather"}, text  # a section may hold several
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMA)
    free = rng.choice(256, size=len(ids) - len(tokenizer.encode(prefix, False)))
    loose = tokenizer.decode(tokenizer.encode(prefix, False) + [int(t) for t in free])
    assert parse_whole(fmt, loose, known)[1] == [], loose


def _walk_until_call(constraint, rng, closers) -> list[int]:
    """Random allowed tokens until the call the text opened is whole: the grammar is back in
    free text, where every byte is allowed again."""
    ids: list[int] = []
    while len(ids) < 400:
        allowed = np.flatnonzero(constraint.allowed_mask())
        if len(allowed) >= 256:
            break
        special = allowed[allowed >= 256]
        token = int(special[0]) if len(special) and len(allowed) < 30 else int(rng.choice(allowed))
        ends = [c for c in closers if c in set(allowed.tolist())]
        if ends and rng.random() < 0.5:
            token = ends[0]
        ids.append(token)
        constraint.accept(token)
    return ids
