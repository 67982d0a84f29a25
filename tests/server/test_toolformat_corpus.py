"""Every tool-call format over its corpus (tests/server/toolformat_corpus.py): the whole parse
gives exactly the expected content, reasoning and calls; fed in random pieces (seeded) the
stream gives the same, each call's id and name before its arguments, and its argument
fragments adding up to the whole parse's arguments."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from agentkv.server.output_parser import OutputParser, OutputSpec, parse_output
from agentkv.server.tool_policy import tool_policy
from agentkv.server.toolformats import get_format
from tests.server.toolformat_corpus import TOOLS, Case, dumps, family_cases

H_BEGIN, H_END = "<tool_call>", "</tool_call>"
DS = {k: f"<｜{k}｜>" for k in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin", "tool▁call▁end", "tool▁sep")}


def _xml_value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def w_hermes(calls):
    return "\n".join(
        f'{H_BEGIN}\n{{"name": "{n}", "arguments": {dumps(a, i % 2 == 1)}}}\n{H_END}' for i, (n, a) in enumerate(calls)
    )


def w_qwen3_coder(calls):
    def params(a):
        return "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in a.items())

    return "\n".join(f"{H_BEGIN}\n<function={n}>\n{params(a)}</function>\n{H_END}" for n, a in calls)


def w_llama3(calls):
    return "<|python_tag|>" + "; ".join(f'{{"name": "{n}", "parameters": {dumps(a)}}}' for n, a in calls)


def w_llama3_bare(calls):
    return "; ".join(f'{{"name": "{n}", "arguments": {dumps(a, True)}}}' for n, a in calls)


def w_pythonic(calls):
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls) + "]"


def w_mistral(calls):
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in calls)


def w_mistral_v3(calls):
    return "[TOOL_CALLS][" + ", ".join(f'{{"name": "{n}", "arguments": {dumps(a)}}}' for n, a in calls) + "]"


def w_harmony(calls):
    """The role form, as the grammar writes calls and gpt-oss's template renders them back."""
    return "<|start|>assistant".join(
        f" to=functions.{n}<|channel|>commentary json<|message|>{dumps(a)}<|call|>" for n, a in calls
    )


def w_harmony_channel(calls):
    """The channel form, which the model may write as well."""
    return "<|start|>assistant".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{dumps(a)}<|call|>" for n, a in calls
    )


def w_deepseek_v3(calls):
    inner = "\n".join(
        f"{DS['tool▁call▁begin']}function{DS['tool▁sep']}{n}\n```json\n{dumps(a)}\n```{DS['tool▁call▁end']}"
        for n, a in calls
    )
    return DS["tool▁calls▁begin"] + inner + DS["tool▁calls▁end"]


def w_deepseek_v31(calls):
    inner = "".join(f"{DS['tool▁call▁begin']}{n}{DS['tool▁sep']}{dumps(a)}{DS['tool▁call▁end']}" for n, a in calls)
    return DS["tool▁calls▁begin"] + inner + DS["tool▁calls▁end"]


def w_glm(calls):
    def pairs(a):
        return "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_xml_value(v)}</arg_value>\n" for k, v in a.items())

    return "\n".join(f"{H_BEGIN}{n}\n{pairs(a)}{H_END}" for n, a in calls)


def w_kimi(calls):
    inner = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{dumps(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


W = {"city": "Oslo"}
CALL1 = [("get_weather", W)]
# Per family: malformed calls (kept as content, verbatim), unknown names, half markers, ...
EXTRA: dict[str, list[Case]] = {
    "hermes": [
        Case("malformed_json", f"{H_BEGIN}{{not json}}{H_END}", f"{H_BEGIN}{{not json}}{H_END}", []),
        Case(
            "unknown_name",
            f'{H_BEGIN}{{"name": "rm_rf", "arguments": {{}}}}{H_END}',
            f'{H_BEGIN}{{"name": "rm_rf", "arguments": {{}}}}{H_END}',
            [],
        ),
        Case("half_tag_text", "a <tool b", "a <tool b", []),
        Case(
            "unterminated_whole_json",
            f'{H_BEGIN}\n{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}',
            None,
            CALL1,
        ),
        Case(
            "arguments_first",
            f'{H_BEGIN}{{"arguments": {{"city": "Oslo"}}, "name": "get_weather"}}{H_END}',
            None,
            CALL1,
        ),
        Case(
            "string_arguments",
            f'{H_BEGIN}{{"name": "get_weather", "arguments": "{{\\"city\\": \\"Oslo\\"}}"}}{H_END}',
            None,
            CALL1,
        ),
        Case("no_name", f'{H_BEGIN}{{"arguments": {{}}}}{H_END}', f'{H_BEGIN}{{"arguments": {{}}}}{H_END}', []),
    ],
    "qwen3_coder": [
        Case("no_function", f"{H_BEGIN}\nhello\n{H_END}", f"{H_BEGIN}\nhello\n{H_END}", []),
        Case(
            "unknown_name",
            f"{H_BEGIN}\n<function=rm>\n</function>\n{H_END}",
            f"{H_BEGIN}\n<function=rm>\n</function>\n{H_END}",
            [],
        ),
        Case(
            "typed_values",
            f"{H_BEGIN}\n<function=search_docs>\n<parameter=query>\n42\n</parameter>\n<parameter=limit>\n7\n</parameter>\n<parameter=exact>\nfalse\n</parameter>\n</function>\n{H_END}",
            None,
            [("search_docs", {"query": "42", "limit": 7, "exact": False})],
        ),
        Case(
            "unclosed_parameter",
            f"{H_BEGIN}\n<function=get_weather>\n<parameter=city>\nOslo\n</function>\n{H_END}",
            None,
            CALL1,
        ),
        Case("half_tag_text", "x <tool_ca", "x <tool_ca", []),
    ],
    "llama3_json": [
        Case("bare_object", w_llama3_bare(CALL1), None, CALL1),
        Case("bare_parallel", w_llama3_bare([*CALL1, ("noop", {})]), None, [*CALL1, ("noop", {})]),
        Case("not_a_call_json", '{"answer": 42}', '{"answer": 42}', []),
        Case("malformed_after_tag", "<|python_tag|>{oops", "<|python_tag|>{oops", []),
        Case("ends_at_eom", w_llama3(CALL1) + "<|eom_id|>", None, CALL1),
        Case(
            "unknown_name",
            '<|python_tag|>{"name": "x", "parameters": {}}',
            '<|python_tag|>{"name": "x", "parameters": {}}',
            [],
        ),
    ],
    "pythonic": [
        Case("llama4_tags", "<|python_start|>" + w_pythonic(CALL1) + "<|python_end|>", None, CALL1),
        Case("text_then_list_is_text", "See [1] and [2].", "See [1] and [2].", []),
        Case("list_not_calls", "[1, 2, 3]", "[1, 2, 3]", []),
        Case("positional_argument", "[get_weather('Oslo')]", "[get_weather('Oslo')]", []),
        Case("python_literals", "[note(text='a', when=None)]", None, [("note", {"text": "a", "when": None})]),
        Case("second_malformed", "[get_weather(city='Oslo'), add(a=)]", "add(a=)]", CALL1),
        Case(
            "call_inside_reasoning",
            "<think>go <|python_start|>[noop()]<|python_end|></think>",
            None,
            [("noop", {})],
            "go ",
        ),
    ],
    "mistral": [
        Case("call_id_form", '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}', None, CALL1),
        Case("no_args_marker", '[TOOL_CALLS]get_weather{"city": "Oslo"}', None, CALL1),
        Case("list_form_too", w_mistral_v3(CALL1), None, CALL1),
        Case("malformed", "[TOOL_CALLS]oops no args", "[TOOL_CALLS]oops no args", []),
        Case("half_marker_text", "Answer [TOOL", "Answer [TOOL", []),
    ],
    "mistral_v3": [
        Case(
            "with_ids",
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "abcDEF123"}]',
            None,
            CALL1,
        ),
        Case("args_form_too", w_mistral(CALL1), None, CALL1),
        Case("malformed", "[TOOL_CALLS][{bad}]", "[TOOL_CALLS][{bad}]", []),
        Case("end_of_sentence", w_mistral_v3(CALL1) + "</s>", None, CALL1),
    ],
    "harmony": [
        Case(
            "reasoning_then_call",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + w_harmony(CALL1),
            None,
            CALL1,
            "Need weather.",
        ),
        Case(
            "final_answer",
            "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
            "It is 4.",
            [],
            "easy",
        ),
        Case(
            "call_on_analysis",
            '<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
            None,
            CALL1,
        ),
        Case(
            "recipient_before_channel",
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>',
            None,
            CALL1,
        ),
        Case(
            "preamble_then_call",
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + w_harmony(CALL1),
            "Checking.",
            CALL1,
        ),
        Case("channel_form", w_harmony_channel(CALL1), None, CALL1),
        Case("channel_form_parallel", w_harmony_channel(CALL1 * 2), None, CALL1 * 2),
        Case(
            "channel_form_after_reasoning",
            "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant" + w_harmony_channel(CALL1),
            None,
            CALL1,
            "Need it.",
        ),
        Case(
            "role_form_then_channel_form",
            w_harmony(CALL1) + "<|start|>assistant" + w_harmony_channel(CALL1),
            None,
            CALL1 * 2,
        ),
        Case("text_to_is_not_a_recipient", "I want to=go there.", "I want to=go there.", []),
        Case(
            "unknown_recipient",
            "<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}<|call|>",
            "<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}<|call|>",
            [],
        ),
        Case("no_header", "plain words", "plain words", []),
        Case("unfinished_final", "<|channel|>final<|message|>partial answ", "partial answ", []),
    ],
    "deepseek_v3": [
        Case("v31_form_too", w_deepseek_v31(CALL1), None, CALL1),
        Case(
            "malformed",
            DS["tool▁calls▁begin"] + "garbage" + DS["tool▁calls▁end"],
            DS["tool▁calls▁begin"] + "garbage" + DS["tool▁calls▁end"],
            [],
        ),
        Case("unterminated", w_deepseek_v3(CALL1).removesuffix(DS["tool▁calls▁end"]), None, CALL1),
    ],
    "deepseek_v31": [
        Case("v3_form_too", w_deepseek_v3(CALL1), None, CALL1),
        Case(
            "unknown_name",
            DS["tool▁calls▁begin"]
            + DS["tool▁call▁begin"]
            + "rm"
            + DS["tool▁sep"]
            + "{}"
            + DS["tool▁call▁end"]
            + DS["tool▁calls▁end"],
            DS["tool▁calls▁begin"]
            + DS["tool▁call▁begin"]
            + "rm"
            + DS["tool▁sep"]
            + "{}"
            + DS["tool▁call▁end"]
            + DS["tool▁calls▁end"],
            [],
        ),
        Case("half_marker_text", "ok <｜tool▁cal", "ok <｜tool▁cal", []),
    ],
    "glm45": [
        Case(
            "no_newlines", f"{H_BEGIN}get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>{H_END}", None, CALL1
        ),
        Case(
            "typed_values",
            f"{H_BEGIN}search_docs\n<arg_key>query</arg_key>\n<arg_value>7</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>7</arg_value>\n{H_END}",
            None,
            [("search_docs", {"query": "7", "limit": 7})],
        ),
        Case("unknown_name", f"{H_BEGIN}rm\n{H_END}", f"{H_BEGIN}rm\n{H_END}", []),
        Case("no_arguments_inline", f"{H_BEGIN}noop{H_END}", None, [("noop", {})]),
    ],
    "kimi_k2": [
        Case(
            "no_functions_prefix",
            w_kimi(CALL1).replace("functions.", ""),
            None,
            CALL1,
        ),
        Case(
            "malformed_head",
            "<|tool_calls_section_begin|><|tool_call_begin|>bad<|tool_call_end|><|tool_calls_section_end|>",
            "<|tool_calls_section_begin|><|tool_call_begin|>bad<|tool_call_end|><|tool_calls_section_end|>",
            [],
        ),
        Case("unterminated_section", w_kimi(CALL1).removesuffix("<|tool_calls_section_end|>"), None, CALL1),
    ],
}

FAMILIES: dict[str, tuple[Any, dict[str, Any], str]] = {
    # name: (writer, family_cases options, reasoning parser)
    "hermes": (w_hermes, {}, "think"),
    "qwen3_coder": (w_qwen3_coder, {}, "think"),
    "llama3_json": (w_llama3, {"after": False}, "think"),
    "pythonic": (w_pythonic, {"before": False, "think": None}, "think"),
    "mistral": (w_mistral, {}, "mistral"),
    "mistral_v3": (w_mistral_v3, {}, "mistral"),
    "harmony": (w_harmony, {"before": False, "after": False, "think": None}, "harmony"),
    "deepseek_v3": (w_deepseek_v3, {}, "think"),
    "deepseek_v31": (w_deepseek_v31, {}, "think"),
    "glm45": (w_glm, {}, "think"),
    "kimi_k2": (w_kimi, {}, "think"),
}
THINK_TAGS = {"think": ("<think>", "</think>"), "mistral": ("[THINK]", "[/THINK]")}


def _cases() -> list[Any]:
    out = []
    for name, (write, opts, reasoning) in FAMILIES.items():
        if "think" not in opts and reasoning in THINK_TAGS:
            opts = {**opts, "think": THINK_TAGS[reasoning]}
        for case in family_cases(write, **opts) + EXTRA[name]:
            out.append(pytest.param(name, reasoning, case, id=f"{name}-{case.id}"))
    return out


def _spec(name: str, reasoning: str) -> OutputSpec:
    policy = tool_policy(TOOLS, "auto", True)
    return OutputSpec(policy, reasoning if reasoning in THINK_TAGS else False, False, get_format(name))


def test_every_family_has_thirty_cases():
    counts = {name: 0 for name in FAMILIES}
    for param in _cases():
        counts[param.values[0]] += 1
    assert min(counts.values()) >= 30, counts


@pytest.mark.parametrize(("name", "reasoning", "case"), _cases())
def test_corpus(name, reasoning, case):
    spec = _spec(name, reasoning)
    whole = parse_output(case.text, spec)
    assert whole.content == case.content
    assert whole.reasoning == case.reasoning
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == case.calls
    _check_ids(name, whole.calls)
    rng = random.Random(hash(case.id) % 1000)
    for _ in range(3):
        _check_stream(spec, case.text, whole, rng)


def _check_ids(name: str, calls: list[Any]) -> None:
    for i, call in enumerate(calls):
        if name.startswith("mistral"):
            assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id)
        elif name == "kimi_k2":
            assert re.fullmatch(rf"(functions\.)?{call.name}:{i}", call.id)
        else:
            assert call.id.startswith("call_")


def _check_stream(spec: OutputSpec, text: str, whole: Any, rng: random.Random) -> None:
    parser = OutputParser(spec)
    events, pos = [], 0
    while pos < len(text):
        step = rng.randint(1, 6)
        events += parser.feed(text[pos : pos + step])
        pos += step
    events += parser.finish()
    content = "".join(e.text for e in events if e.kind == "content")
    assert (content.strip() if parser.calls else content) == (whole.content or "")
    assert ("".join(e.text for e in events if e.kind == "reasoning") or None) == whole.reasoning
    assert [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments) for c in whole.calls]
    started: set[int] = set()
    fragments: dict[int, str] = {}
    for e in events:
        if e.kind == "call":
            assert e.index not in started and e.call.name and e.call.id
            started.add(e.index)
        elif e.kind == "arguments":
            assert e.index in started  # id and name come first
            fragments[e.index] = fragments.get(e.index, "") + e.text
    assert [fragments.get(i, "") for i in range(len(parser.calls))] == [c.arguments for c in whole.calls]
