"""The formats by name, and the choice of one for a model: from its chat template's markers
and its tokenizer's special tokens, or named by flag (`--tool-call-parser`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from agentkv.server.toolformats.base import ToolFormat


def _hermes() -> ToolFormat:
    from agentkv.server.toolformats.hermes import HermesFormat

    return HermesFormat()


def _qwen3_coder() -> ToolFormat:
    from agentkv.server.toolformats.qwen3_coder import Qwen3CoderFormat

    return Qwen3CoderFormat()


def _llama3() -> ToolFormat:
    from agentkv.server.toolformats.llama3 import Llama3JsonFormat

    return Llama3JsonFormat()


def _pythonic() -> ToolFormat:
    from agentkv.server.toolformats.pythonic import PythonicFormat

    return PythonicFormat()


def _mistral(args_form: bool) -> Callable[[], ToolFormat]:
    def make() -> ToolFormat:
        from agentkv.server.toolformats.mistral import MistralFormat

        return MistralFormat(args_form)

    return make


def _harmony() -> ToolFormat:
    from agentkv.server.toolformats.harmony import HarmonyFormat

    return HarmonyFormat()


def _deepseek(v31: bool) -> Callable[[], ToolFormat]:
    def make() -> ToolFormat:
        from agentkv.server.toolformats.deepseek import DeepSeekFormat

        return DeepSeekFormat(v31)

    return make


def _glm() -> ToolFormat:
    from agentkv.server.toolformats.glm import GlmFormat

    return GlmFormat()


def _kimi() -> ToolFormat:
    from agentkv.server.toolformats.kimi import KimiFormat

    return KimiFormat()


FORMATS: dict[str, Callable[[], ToolFormat]] = {
    "hermes": _hermes,
    "qwen3_coder": _qwen3_coder,
    "llama3_json": _llama3,
    "pythonic": _pythonic,
    "mistral": _mistral(True),
    "mistral_v3": _mistral(False),
    "harmony": _harmony,
    "deepseek_v3": _deepseek(False),
    "deepseek_v31": _deepseek(True),
    "glm45": _glm,
    "kimi_k2": _kimi,
}
REASONING_PARSERS = ("none", "think", "mistral", "harmony")


def get_format(name: str) -> ToolFormat:
    """The format called `name`; a ValueError naming the known ones otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call parser {name!r}: known are {sorted(FORMATS)}")
    return FORMATS[name]()


class Choice(NamedTuple):
    """A model's formats and why they were chosen (for `inspect` and the start log)."""

    tool_format: str
    tool_reason: str
    reasoning: str
    reasoning_reason: str


# (format, markers any one of which picks it), checked in order: the more specific first.
_TOOL_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|call|>", "<|constrain|>")),
    ("kimi_k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek_v3", ("<｜tool▁sep｜>function", "```json")),
    ("deepseek_v31", ("<｜tool▁calls▁begin｜>",)),
    ("glm45", ("<arg_key>",)),
    ("qwen3_coder", ("<function=", "<parameter=")),
    ("mistral", ("[ARGS]",)),
    ("mistral_v3", ("[TOOL_CALLS]",)),
    ("pythonic", ("<|python_start|>", "[func_name1(")),
    ("llama3_json", ("<|python_tag|>", '"parameters": ')),
    ("hermes", ("<tool_call>",)),
)


def detect(template: str, special_tokens: Iterable[str] = ()) -> Choice:
    """Formats for a model whose chat template text is `template`. DeepSeek's V3 form needs
    both the section marker and its fenced JSON; everything else needs one marker."""
    text = template + "\n" + "\n".join(special_tokens)
    tool, tool_reason = "hermes", "the template writes no known tool-call markers: Hermes, taught in the system prompt"
    for name, markers in _TOOL_MARKERS:
        hit = next((m for m in markers if m in text), None)
        if hit is None or (name == "deepseek_v3" and "<｜tool▁calls▁begin｜>" not in text):
            continue
        if name == "deepseek_v3" and "<｜tool▁sep｜>function" not in text:
            continue
        tool, tool_reason = name, f"the template or special tokens hold {hit!r}"
        break
    reasoning, why = _reasoning(text, tool)
    return Choice(tool, tool_reason, reasoning, why)


def _reasoning(text: str, tool: str) -> tuple[str, str]:
    if tool == "harmony":
        return "harmony", "harmony's analysis channel is its reasoning"
    if "[THINK]" in text:
        return "mistral", "the template or special tokens hold '[THINK]'"
    if "<think>" in text:
        return "think", "the template or special tokens hold '<think>'"
    return "none", "the template writes no reasoning markers"
