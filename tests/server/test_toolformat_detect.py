"""Which format a model gets, and why: detected from the chat template and special tokens
(each test family's template picks its own), the packaged SmolLM2 keeps Hermes taught in the
system prompt, flags override, an unknown flag value is refused naming the known ones, and
`agentkv inspect` reports the choice."""

from __future__ import annotations

import json

import pytest

from agentkv.cli import main
from agentkv.formats.chat_template import ChatTemplate, load_chat_template
from agentkv.formats.resolve import open_model
from agentkv.server.toolformats import FORMATS, check_parsers, choose, detect
from tests.server.toolformat_models import FAMILIES


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_template_picks_its_format(family):
    template, specials, _ = FAMILIES[family]
    found = choose(ChatTemplate(template), specials)
    assert found.tool_format == family
    assert found.reasoning == ("harmony" if family == "harmony" else "none")


@pytest.mark.parametrize(
    ("text", "tokens", "want"),
    [
        ("{{ tools }}<｜tool▁calls▁begin｜><｜tool▁sep｜>function ```json", [], "deepseek_v3"),
        # V3/R1 as their templates write it: no literal "<｜tool▁sep｜>function" (was taken for V3.1)
        ("{{ tools }}{{ '<｜tool▁calls▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + '```json' }}", [], "deepseek_v3"),
        ("{{ tools }}<｜tool▁calls▁begin｜>{{ name }}<｜tool▁sep｜>", [], "deepseek_v31"),
        ("{{ tools }}", ["<|tool_calls_section_begin|>"], "kimi_k2"),
        ("{{ tools }}<tool_call>{{ name }}<arg_key>", [], "glm45"),
        ("{{ tools }}[func_name1(params_name1=params_value1)]", [], "pythonic"),
        ("{{ tools }}", ["[TOOL_CALLS]"], "mistral_v3"),
        ("{{ tools }}", ["<|python_tag|>"], "llama3_json"),
        ("{{ tools }} plain", [], "hermes"),
    ],
)
def test_markers(text, tokens, want):
    assert detect(text, tokens).tool_format == want


def test_a_template_without_tools_is_taught_hermes_whatever_its_tokens():
    found = detect("{{ messages }}<think>", ["[TOOL_CALLS]", "<|python_tag|>"], renders_tools=False)
    assert (found.tool_format, found.reasoning) == ("hermes", "think")
    assert "taught in the system prompt" in found.tool_reason


def test_smollm2_keeps_hermes():
    found = choose(load_chat_template(open_model("smollm2")), [])
    assert (found.tool_format, found.reasoning) == ("hermes", "none")


def test_flags_override_and_unknown_names_are_refused():
    found = choose(ChatTemplate(FAMILIES["hermes"][0]), [], "mistral", "think")
    assert (found.tool_format, found.tool_reason) == ("mistral", "set by --tool-call-parser")
    assert (found.reasoning, found.reasoning_reason) == ("think", "set by --reasoning-parser")
    with pytest.raises(ValueError, match="'nope' is unknown: known are .*'hermes'"):
        check_parsers("nope", None)
    with pytest.raises(ValueError, match="--reasoning-parser 'x' is unknown"):
        check_parsers(None, "x")
    assert len(FORMATS) == 11


def test_serve_refuses_an_unknown_parser_before_loading(capsys):
    assert main(["serve", "smollm2", "--tool-call-parser", "nope"]) == 2
    assert "--tool-call-parser 'nope' is unknown" in capsys.readouterr().err


def test_inspect_reports_the_choice(capsys):
    assert main(["inspect", "smollm2", "--json"]) == 0
    formats = json.loads(capsys.readouterr().out)["output_formats"]
    assert formats["tool_calls"] == "hermes" and formats["reasoning"] == "none"
    assert main(["inspect", "smollm2"]) == 0
    assert "tool calls    hermes (the template renders no tools" in capsys.readouterr().out
