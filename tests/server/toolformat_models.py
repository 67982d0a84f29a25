"""Tiny random llama models that speak one family's tool-call format: a byte-level tokenizer
with the family's special tokens added, and a chat template (written for these tests, in the
family's documented syntax) that renders tools, calls and tool results the family's way."""

from __future__ import annotations

import json
from pathlib import Path

from tests.models.helpers import tiny_hf_model

_CHATML = """
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}{% if not loop.first %}
{% endif %}CALL{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
_TOOLS = "{%- if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"

HERMES_CALL = (
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
)
QWEN3_CODER_CALL = (
    "<tool_call>\n<function={{ c.function.name }}>\n{% for k, v in c.function.arguments.items() %}"
    "<parameter={{ k }}>\n{{ v if v is string else v | tojson }}\n</parameter>\n{% endfor %}</function>\n</tool_call>"
)
LLAMA3 = (
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{% if loop.first and tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
    "{% endfor %}{% else %}{{ m.content }}{% endif %}<|eot_id|>"
    "{%- endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "<s>{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}</s>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% else %}[INST]{{ m.content }}[/INST]{% endif %}{% endfor %}"
)
HARMONY = (
    "{%- if tools %}<|start|>developer<|message|># Tools\n{{ tools | tojson }}<|end|>{% endif %}"
    "{%- for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json"
    "<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}"
    "{% else %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{% endif %}"
    "{% elif m.role == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)

GLM_CALL = (
    "<tool_call>{{ c.function.name }}\n{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v if v is string else v | tojson }}</arg_value>\n{% endfor %}</tool_call>"
)
KIMI_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>"
    "{{ c.function.arguments | tojson }}<|tool_call_end|><|tool_calls_section_end|>"
)
DEEPSEEK_V31_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>"
    "{{ c.function.arguments | tojson }}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
DEEPSEEK_V3_CALL = (
    "{% if loop.first %}<｜tool▁calls▁begin｜>{% endif %}"  # as V3's template: type + sep + name, fenced JSON
    "{{ '<｜tool▁call▁begin｜>' + 'function' + '<｜tool▁sep｜>' + c.function.name }}\n```json\n"
    "{{ c.function.arguments | tojson }}\n```<｜tool▁call▁end｜>{% if loop.last %}<｜tool▁calls▁end｜>{% endif %}"
)
MISTRAL_V3 = (
    "<s>{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}{% if m.role == 'assistant' %}"
    "{% if m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "{% endfor %}]{% else %}{{ m.content }}{% endif %}</s>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% else %}[INST]{{ m.content }}[/INST]{% endif %}{% endfor %}"
)
PYTHONIC = (  # Llama 4's headers; calls as its template teaches: [func_name1(params_name1=params_value1)]
    "{%- for m in messages %}<|header_start|>{{ 'ipython' if m.role == 'tool' else m.role }}<|header_end|>\n\n"
    "{% if loop.first and tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "{% if m.tool_calls %}[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}{{ k }}={{ v | tojson }}"
    "{% endfor %}){% endfor %}]{% else %}{{ m.content }}{% endif %}<|eot|>"
    "{%- endfor %}{% if add_generation_prompt %}<|header_start|>assistant<|header_end|>\n\n{% endif %}"
)
CHATML = ["<|im_start|>", "<|im_end|>"]

# family: (chat template, special tokens, eos token, the markers a call is written with)
FAMILIES = {
    "hermes": (
        _TOOLS + _CHATML.replace("CALL", HERMES_CALL),
        ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
        "<|im_end|>",
    ),
    "qwen3_coder": (
        _TOOLS + _CHATML.replace("CALL", QWEN3_CODER_CALL),
        ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
        "<|im_end|>",
    ),
    "llama3_json": (LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"], "<|eot_id|>"),
    "mistral": (
        MISTRAL,
        [
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[ARGS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "</s>",
    ),
    "glm45": (
        _TOOLS + _CHATML.replace("CALL", GLM_CALL),
        [*CHATML, "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
        "<|im_end|>",
    ),
    "kimi_k2": (
        _TOOLS + _CHATML.replace("CALL", KIMI_CALL),
        [
            *CHATML,
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ],
        "<|im_end|>",
    ),
    "deepseek_v31": (
        _TOOLS + _CHATML.replace("CALL", DEEPSEEK_V31_CALL),
        [
            *CHATML,
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
        ],
        "<|im_end|>",
    ),
    "deepseek_v3": (
        _TOOLS + _CHATML.replace("CALL", DEEPSEEK_V3_CALL),
        [
            *CHATML,
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
        ],
        "<|im_end|>",
    ),
    "mistral_v3": (
        MISTRAL_V3,
        ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"]
        + ["[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "</s>",
    ),
    "pythonic": (
        PYTHONIC,
        ["<|header_start|>", "<|header_end|>", "<|eot|>", "<|python_start|>", "<|python_end|>"],
        "<|eot|>",
    ),
    "harmony": (
        HARMONY,
        ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"],
        "<|return|>",
    ),
}
VOCAB = 288  # 256 bytes and up to 32 special tokens


def write_family_model(folder: Path, family: str) -> dict[str, int]:
    """A tiny llama in `folder` that chats in `family`'s format; returns its special tokens'
    ids by text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    template, specials, eos = FAMILIES[family]
    tiny_hf_model(folder, "llama", seed=7, vocab_size=VOCAB, max_position_embeddings=1024)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": eos}))
    return {t: tok.token_to_id(t) for t in specials}
