"""Chat rendering: the model's own template, and the Hermes fallback for tool-unaware ones."""

from __future__ import annotations

import json

import pytest

from agentkv.formats.chat_template import ChatTemplate, load_chat_template
from agentkv.formats.resolve import open_model
from agentkv.server.chat import render_chat
from agentkv.server.errors import APIError
from agentkv.server.schemas import ChatMessage

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

# A tool-aware template in the Qwen style, enough to prove tools are passed natively.
NATIVE = (
    "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}{% for m in messages %}"
    "[{{ m.role }}]{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments.city }}"
    "{% endif %}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def smollm2_template():
    template = load_chat_template(open_model("smollm2"))
    assert template is not None and not template.supports_tools
    return template


def msgs(*items):
    return [ChatMessage.model_validate(m) for m in items]


def test_plain_chat_uses_model_template(smollm2_template):
    text = render_chat(smollm2_template, msgs({"role": "user", "content": "Hi"}))
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert "You are a helpful AI assistant named SmolLM" in text


def test_content_parts_join(smollm2_template):
    text = render_chat(
        smollm2_template,
        msgs({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
    )
    assert "user\nab<|im_end|>" in text


def test_image_part_is_a_400(smollm2_template):
    with pytest.raises(APIError) as info:
        render_chat(
            smollm2_template, msgs({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
        )
    assert info.value.status == 400 and info.value.param == "messages.0.content.0"


def test_hermes_fallback_full_tool_loop(smollm2_template):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    text = render_chat(
        smollm2_template,
        msgs(
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "warm"},
        ),
        tools=TOOLS,
    )
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in system
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call><|im_end|>"
    ) in text
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response><|im_end|>"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_tools_without_system_add_one(smollm2_template):
    text = render_chat(smollm2_template, msgs({"role": "user", "content": "x"}), tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert "SmolLM" not in text


def test_native_tool_template_gets_tools_and_parsed_arguments():
    template = ChatTemplate(NATIVE)
    assert template.supports_tools
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    text = render_chat(
        template, msgs({"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}), tools=TOOLS
    )
    assert text.startswith("TOOLS=") and "[assistant]Oslo" in text


def test_no_template_is_a_400():
    with pytest.raises(APIError) as info:
        render_chat(None, msgs({"role": "user", "content": "x"}))
    assert info.value.status == 400


def test_template_error_is_a_400():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(APIError) as info:
        render_chat(template, msgs({"role": "user", "content": "x"}))
    assert "roles must alternate" in info.value.message
