"""The `<think>` reasoning split and the shared output reader, on text alone: streamed in any
pieces it equals the whole parse; a tool call begun inside the reasoning is still a call."""

from __future__ import annotations

import pytest

from agentkv.server.output_parser import OutputParser, OutputSpec, parse_output
from agentkv.server.reasoning import ReasoningStreamParser, prompt_opens_thinking, split_reasoning, template_thinks
from agentkv.server.tool_policy import tool_policy

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = f"<think>maybe {CALL} no, plan first</think>\n\nSure. {CALL}"


def test_split_whole():
    assert split_reasoning("<think>a < b</think>answer", False) == ("a < b", "answer")
    assert split_reasoning("still thinking", True) == ("still thinking", "")
    assert split_reasoning("no tags at all", False) == ("", "no tags at all")
    assert split_reasoning("open</think>done<think>again", True) == ("openagain", "done")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_stream_in_pieces_equals_whole(size):
    parser = ReasoningStreamParser()
    pieces = [parser.feed(TEXT[i : i + size]) for i in range(0, len(TEXT), size)] + [parser.finish()]
    assert ("".join(p.reasoning for p in pieces), "".join(p.content for p in pieces)) == split_reasoning(TEXT, False)
    assert all("<" not in p.reasoning[-1:] for p in pieces)  # never half a tag


def test_a_call_inside_reasoning_is_still_a_call():
    policy = tool_policy([WEATHER], "auto", True)
    out = parse_output(TEXT, OutputSpec(policy, reasoning=True))
    assert out.reasoning == "maybe  no, plan first"
    assert out.content == "Sure."
    assert [(c.name, c.arguments) for c in out.calls] == [("get_weather", '{"city": "Paris"}')] * 2
    # Control: without the reasoning split, the thoughts are content.
    assert parse_output(TEXT, OutputSpec(policy)).content.startswith("<think>maybe")


@pytest.mark.parametrize("size", [1, 4, 9])
def test_streamed_events_add_up_to_the_whole(size):
    spec = OutputSpec(tool_policy([WEATHER], "auto", True), reasoning=True)
    parser = OutputParser(spec)
    events = [e for i in range(0, len(TEXT), size) for e in parser.feed(TEXT[i : i + size])]
    events += parser.finish()
    whole = parse_output(TEXT, spec)
    assert "".join(e.text for e in events if e.kind == "reasoning") == whole.reasoning
    args = "".join(e.call.arguments if e.kind == "call" else e.text for e in events if e.kind in ("call", "arguments"))
    assert args == whole.calls[0].arguments + whole.calls[1].arguments and len(parser.calls) == 2


def test_prompt_and_template_detection():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<think>x</think>\n<|im_start|>assistant\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")

    class Template:
        source = "{% if thinking %}<think>{% endif %}"

    assert template_thinks(Template()) and not template_thinks(None)


def test_earlier_reasoning_reaches_a_template_that_renders_it():
    from agentkv.formats.chat_template import ChatTemplate
    from agentkv.server.chat import render_chat
    from agentkv.server.schemas import ChatMessage

    template = ChatTemplate(
        "{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
        "{{ m.content }}|{% endfor %}{{ tools | length if tools else '' }}"
    )
    messages = [
        ChatMessage(role="user", content="q"),
        ChatMessage.model_validate({"role": "assistant", "content": "a", "reasoning_content": "because"}),
        ChatMessage(role="tool", content="r", tool_call_id="c1"),
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert render_chat(template, messages, tools=tools) == "q|<think>because</think>a|r|1"


def test_anthropic_thinking_reaches_the_template(smollm2_engine):
    """Anthropic's `thinking` (enabled with a budget, or disabled) becomes the template's
    enable_thinking / thinking_budget; count_tokens renders the same prompt a message would."""
    import anthropic

    from agentkv.formats.chat_template import ChatTemplate
    from agentkv.server.app import create_app
    from tests.server.conftest import serve

    template = ChatTemplate(
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking %}<think>budget "
        "{{ thinking_budget }}{% elif enable_thinking is false %}/no_think{% endif %}"
    )
    servers = serve(create_app(smollm2_engine, served_model_name="smollm2", chat_template=template), smollm2_engine)
    client = anthropic.Anthropic(base_url=next(servers).base_url, api_key="x", max_retries=0)

    def count(thinking):
        extra = {"thinking": thinking} if thinking else {}
        msgs = [{"role": "user", "content": "hi"}]
        return client.messages.count_tokens(model="smollm2", messages=msgs, extra_body=extra).input_tokens

    try:
        plain, on, off = count(None), count({"type": "enabled", "budget_tokens": 1024}), count({"type": "disabled"})
    finally:
        servers.close()
    tokenizer = smollm2_engine.tokenizer
    assert plain == len(tokenizer.encode("hi", False))
    assert on == len(tokenizer.encode("hi<think>budget 1024", False))
    assert off == len(tokenizer.encode("hi/no_think", False))
