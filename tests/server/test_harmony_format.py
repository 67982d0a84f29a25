"""Harmony's two call headers and the render-back that keeps the prefix cache warm: the parser
reads a call addressed in the role header (` to=functions.NAME<|channel|>commentary json`, what
gpt-oss's chat template renders) and in the channel header (`<|channel|>commentary
to=functions.NAME <|constrain|>json`), whole and fed one character at a time; a forced call is
written in the template's form, its markers as the special tokens the tokenizer makes of them;
a strict call under `auto` is held to whichever form the text opened; and an earlier call's
arguments render back as the very JSON text generated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentkv.formats.chat_template import ChatTemplate, JSONArguments
from agentkv.formats.tokenizer import Tokenizer
from agentkv.runtime.structured import ConstraintFactory, GrammarConstraint
from agentkv.server.output_parser import OutputParser, OutputSpec, parse_output
from agentkv.server.tool_policy import constraint_builder, tool_policy
from agentkv.server.toolformats import ParseContext, get_format, parse_whole
from agentkv.server.toolformats.registry import MARKER_TOKENS
from tests.models.llamacpp_convert import SRC, source_missing

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}
ARGS = '{"city": "Oslo"}'
ROLE = f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>"
CHANNEL = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}<|call|>"
THOUGHT = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
TEMPLATE = SRC / "models" / "templates" / "openai-gpt-oss-120b.jinja"


def _spec() -> OutputSpec:
    return OutputSpec(tool_policy([WEATHER], "auto", True), False, False, get_format("harmony"))


@pytest.mark.parametrize(
    ("text", "reasoning"),
    [(ROLE, None), (CHANNEL, None), (THOUGHT + ROLE, "Need the weather."), (THOUGHT + CHANNEL, "Need the weather.")],
    ids=["role", "channel", "role_after_analysis", "channel_after_analysis"],
)
def test_both_headers_parse_whole_and_char_by_char(text, reasoning):
    """No header text leaks out as content (the role form's leading ` to=...` is held back
    until its `<|channel|>` shows it is a header), the call is announced before its `<|call|>`
    arrives, and its argument fragments add up to the whole parse's arguments."""
    whole = parse_output(text, _spec())
    assert (whole.content, whole.reasoning) == (None, reasoning)
    assert [(c.name, c.arguments) for c in whole.calls] == [("get_weather", ARGS)]
    parser, events, announced_at = OutputParser(_spec()), [], None
    for i, char in enumerate(text):
        events += parser.feed(char)
        if announced_at is None and any(e.kind == "call" for e in events):
            announced_at = i
    events += parser.finish()
    assert "".join(e.text for e in events if e.kind == "content") == ""
    assert ("".join(e.text for e in events if e.kind == "reasoning") or None) == reasoning
    assert announced_at is not None and announced_at < text.index("<|call|>")
    assert "".join(e.text for e in events if e.kind == "arguments") == ARGS


def test_text_before_the_role_form_is_content_and_to_elsewhere_is_text():
    fmt, ctx = get_format("harmony"), ParseContext.of_tools([WEATHER])
    content, calls = parse_whole(fmt, "Let me see." + ROLE, ctx)
    assert (content, [(c.name, c.arguments) for c in calls]) == ("Let me see.", [("get_weather", ARGS)])
    for text in ("I want to=go there.", "photo=x<|channel|>final<|message|>hi<|end|>"):
        content, calls = parse_whole(fmt, text, ctx)
        assert calls == [] and content.startswith(text[:7])


def test_the_grammar_writes_what_render_calls_and_the_template_render_back():
    """The forced call's header, `render_calls` and gpt-oss's own template agree byte for byte."""
    fmt = get_format("harmony")
    header = fmt.grammar([WEATHER]).calls[0][0][1]
    rendered = fmt.render_calls([("get_weather", ARGS)])
    assert rendered == header + ARGS + "<|call|>" == ROLE
    if source_missing() or not TEMPLATE.is_file():
        pytest.skip(f"gpt-oss's chat template is not at {TEMPLATE}: {source_missing()}")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": JSONArguments({}, ARGS)}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert "<|start|>assistant" + rendered in ChatTemplate(TEMPLATE.read_text()).render(messages, tools=[WEATHER])


def test_arguments_render_back_as_generated():
    """JSON a grammar may write but `json.dumps` would respell (a trailing zero, an escape)
    renders back unchanged; control: the parsed dict alone renders respelled. An explicit
    `tojson` option still serializes the dict."""
    text = '{"t": 1.50, "s": "caf\\u00e9"}'
    template = ChatTemplate("{{ messages[0].args | tojson }}|{{ messages[0].args | tojson(indent=1) }}")
    kept = template.render([{"role": "user", "args": JSONArguments(json.loads(text), text)}])
    plain = template.render([{"role": "user", "args": json.loads(text)}])
    assert kept.split("|")[0] == text
    assert plain.split("|")[0] == '{"t": 1.5, "s": "café"}' != text
    assert kept.split("|")[1] == plain.split("|")[1] == json.dumps(json.loads(text), ensure_ascii=False, indent=1)


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


def _allowed(constraint) -> set[int]:
    return set(np.flatnonzero(constraint.allowed_mask()).tolist())


def test_a_forced_call_writes_its_markers_as_special_tokens(factory):
    """After ` to=functions.get_weather` only the `<|channel|>` token is allowed, so the call's
    tokens are those the tokenizer makes of the rendered call. Control: the same literal as a
    plain string also admits spelling the marker in bytes (a `<`)."""
    import xgrammar as xgr

    tokenizer, build = factory
    constraint = constraint_builder(tool_policy([WEATHER], "required", False), None, get_format("harmony"))(build)
    for token in tokenizer.encode(" to=functions.get_weather", False):
        constraint.accept(token)
    channel, less = tokenizer.token_to_id("<|channel|>"), tokenizer.encode("<", False)[0]
    assert _allowed(constraint) == {channel}
    for token in tokenizer.encode("<|channel|>commentary json<|message|>" + ARGS, False):
        assert token in _allowed(constraint)
        constraint.accept(token)
    assert constraint.is_finished()
    spelled = build._compiler.compile_grammar(xgr.Grammar.from_ebnf('root ::= "<|channel|>"'))
    assert {channel, less} <= _allowed(GrammarConstraint(spelled, build.vocab_size))


@pytest.mark.parametrize(
    ("opener", "form"),
    [(" to=functions.", "<|channel|>commentary json<|message|>"), ("<|channel|>commentary to=", " <|constrain|>json")],
    ids=["role", "channel"],
)
def test_a_strict_call_under_auto_keeps_the_form_it_opened(factory, opener, form):
    """`strict` under `auto`: once free text (an analysis message, then `<|start|>assistant`)
    opens a call in either form, a random walk finishes it in that same form, and it parses."""
    tokenizer, build = factory
    strict = [{"type": "function", "function": {**WEATHER["function"], "strict": True}}]
    constraint = constraint_builder(tool_policy(strict, "auto", False), None, get_format("harmony"))(build)
    ids = tokenizer.encode(THOUGHT + opener, False)
    rng = np.random.default_rng(5)
    for token in ids:
        assert constraint.allowed_mask()[token]
        constraint.accept(token)
    while len(_allowed(constraint)) < 256:  # inside the call: held to the grammar
        token = int(rng.choice(sorted(_allowed(constraint))))
        ids.append(token)
        constraint.accept(token)
    text = tokenizer.decode(ids)
    assert form in text
    _, calls = parse_whole(get_format("harmony"), text, ParseContext.of_tools(strict))
    assert [c.name for c in calls] == ["get_weather"] and json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
