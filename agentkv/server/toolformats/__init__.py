"""Tool calls and reasoning in each model family's own text: one interface, one file per
format, a registry that picks one from the chat template (see registry.py)."""

from agentkv.server.toolformats.base import Call, ParseContext, Scan, Text, ToolFormat
from agentkv.server.toolformats.registry import (
    FORMATS,
    REASONING_PARSERS,
    Choice,
    check_parsers,
    choose,
    detect,
    get_format,
    special_token_texts,
)
from agentkv.server.toolformats.stream import CallLog, CallStream, OutputEvent, ParsedCall, parse_whole

__all__ = [
    "FORMATS",
    "REASONING_PARSERS",
    "Call",
    "CallLog",
    "CallStream",
    "Choice",
    "OutputEvent",
    "ParseContext",
    "ParsedCall",
    "Scan",
    "Text",
    "check_parsers",
    "choose",
    "special_token_texts",
    "ToolFormat",
    "detect",
    "get_format",
    "parse_whole",
]
