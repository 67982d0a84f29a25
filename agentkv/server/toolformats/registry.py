"""The formats by name, and the choice of one for a model: from its chat template's markers
and its tokenizer's special tokens, or named by flag (`--tool-call-parser`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

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
# Special tokens a constrained call may write: the families' own call markers.
MARKER_TOKENS = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "<|python_start|>",
        "<|python_end|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "<|start|>",
        "<|channel|>",
        "<|constrain|>",
        "<|message|>",
        "<|call|>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    }
)


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


def detect(template: str, special_tokens: Iterable[str] = (), renders_tools: bool = True) -> Choice:
    """Formats for a model whose chat template text is `template`. A template that renders
    no tools gets Hermes, taught in the system prompt (chat.py), whatever its tokens say;
    DeepSeek's V3 form needs its section marker and fenced JSON; every other format needs one of its markers.
    Reasoning comes from the template text alone (tokens are often reserved, unused)."""
    reasoning, why = _reasoning(template)
    if not renders_tools:
        return Choice("hermes", "the template renders no tools: Hermes, taught in the system prompt", reasoning, why)
    text = template + "\n" + "\n".join(special_tokens)
    for name, markers in _TOOL_MARKERS:
        hit = next((m for m in markers if m in text), None)
        if hit is None or (name == "deepseek_v3" and "<｜tool▁calls▁begin｜>" not in text):
            continue  # V3/R1 templates write `tool['type'] + '<｜tool▁sep｜>'` and a ```json fence
        if name == "harmony":
            reasoning, why = "harmony", "harmony's analysis channel is its reasoning"
        return Choice(name, f"the template or special tokens hold {hit!r}", reasoning, why)
    return Choice("hermes", "the template writes no known tool-call markers: Hermes", reasoning, why)


def choose(
    template: Any,
    special_tokens: Iterable[str] = (),
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> Choice:
    """A model's formats: detected from `template` (a ChatTemplate, or None) and the
    tokenizer's special tokens, each overridden by its flag when given."""
    check_parsers(tool_parser, reasoning_parser)
    source = getattr(template, "source", "") or ""
    found = detect(source, special_tokens, bool(getattr(template, "supports_tools", False)))
    if tool_parser is not None:
        found = found._replace(tool_format=tool_parser, tool_reason="set by --tool-call-parser")
    if reasoning_parser is not None:
        found = found._replace(reasoning=reasoning_parser, reasoning_reason="set by --reasoning-parser")
    return found


def check_parsers(tool_parser: str | None, reasoning_parser: str | None) -> None:
    """A ValueError naming the known names for an unknown flag value."""
    if tool_parser is not None and tool_parser not in FORMATS:
        raise ValueError(f"--tool-call-parser {tool_parser!r} is unknown: known are {sorted(FORMATS)}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser {reasoning_parser!r} is unknown: known are {list(REASONING_PARSERS)}")


def special_token_texts(tokenizer: Any) -> list[str]:
    """The text of each special token of an agentkv Tokenizer (none for anything else)."""
    ids = sorted(getattr(tokenizer, "special_ids", ()))
    return [t for t in (tokenizer.id_to_token(i) for i in ids) if t]


def _reasoning(template: str) -> tuple[str, str]:
    if "[THINK]" in template:
        return "mistral", "the template writes '[THINK]'"
    if "<think>" in template:
        return "think", "the template writes '<think>'"
    return "none", "the template writes no reasoning markers"
