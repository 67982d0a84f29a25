"""Chat templates: a model's own jinja2 template, rendered exactly as HF `apply_chat_template` does.

The environment mirrors transformers' `utils/chat_template_utils.py`: an
`ImmutableSandboxedEnvironment` with trim_blocks/lstrip_blocks and loop controls, a `tojson`
that does not HTML-escape, `raise_exception`, `strftime_now`, a safe `dict` and a `namespace`
that refuses underscore names. Messages lose their None-valued keys, and reasoning under an old
name is also offered as `reasoning_content`/`thinking`, as HF does before rendering.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentkv.formats.errors import ChatTemplateError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_TOOLS_REFERENCE = re.compile(r"\btools\b")
# HF's SPECIAL_TOKENS_ATTRIBUTES: the names `special_tokens_map` offers to every template.
_SPECIAL_TOKEN_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class JSONArguments(dict):
    """A tool call's arguments as the template sees them (a dict), remembering the JSON text
    they were parsed from: `tojson` writes that text back unchanged, so a call rendered back
    into the next prompt is byte for byte the JSON the model generated (its number spellings
    and string escapes included, which a re-serialization could change) and the prefix cache
    covers it. A `tojson` with options (indent, separators, ...) serializes the dict as usual.
    The text's attribute name is one no JSON key is: jinja looks attributes up before keys."""

    __slots__ = ("_agentkv_json_text",)

    def __init__(self, value: dict[str, Any], text: str) -> None:
        super().__init__(value)
        self._agentkv_json_text = text


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson HTML-escapes '<', '>', '&' and "'"; HF's does not.
    if isinstance(x, JSONArguments) and not (ensure_ascii or indent is not None or separators or sort_keys):
        return x._agentkv_json_text
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates, without attribute access to the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's `namespace`, refusing underscore-prefixed names (a path to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- jinja's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
            )


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def _prepare_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Copies of the messages without None-valued keys, with reasoning aliased (HF's order)."""
    prepared = []
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"chat messages must be dicts, got {type(message).__name__}: {message!r}")
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


class ChatTemplate:
    """A compiled chat template. Immutable; `render` is safe to call from many threads."""

    def __init__(
        self,
        source: str,
        bos_token: str | None = None,
        eos_token: str | None = None,
        origin: str = "<memory>",
        **special_tokens: str | None,
    ) -> None:
        """`special_tokens` (e.g. `pad_token`, `unk_token`) are offered to the template like
        HF's `special_tokens_map`; `origin` names the file in errors."""
        self.source = source
        self.origin = origin
        self.special_tokens = {
            k: v for k, v in dict(bos_token=bos_token, eos_token=eos_token, **special_tokens).items() if v is not None
        }
        try:
            self._template = _compile(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"{origin}: chat template does not compile: {exc.message} (line {exc.lineno})"
            ) from exc

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    @property
    def supports_tools(self) -> bool:
        """Whether the template text reads a `tools` variable at all."""
        return bool(_TOOLS_REFERENCE.search(self.source))

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-shaped dicts). Pure: inputs are not mutated.

        Extra `kwargs` (e.g. `enable_thinking`) reach the template as variables and override
        the special tokens, as in HF. Raises ChatTemplateError with the template's own message."""
        if not messages:
            raise ChatTemplateError(f"{self.origin}: cannot render an empty conversation; give at least one message")
        variables = {**self.special_tokens, **kwargs}
        try:
            return self._template.render(
                messages=_prepare_messages(messages),
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin}: chat template raised: {exc.message or exc}") from exc


def _folder_template(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """`chat_template.jinja` wins over tokenizer_config.json's `chat_template` (as in HF)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default")
    return template


def _token_name(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def load_chat_template(source: Any, template: str | None = None) -> ChatTemplate | None:
    """The chat template of a `ModelSource`, or `template` if given (it wins); None when neither
    exists. Special tokens come from the GGUF token ids or tokenizer_config.json."""
    chosen, _, names = _find_template(source)
    chosen = template if template is not None else chosen
    return ChatTemplate(chosen, origin=str(source.path), **names) if chosen else None


def require_chat_template(source: Any, template: str | None = None) -> ChatTemplate:
    """Like `load_chat_template`, but a model without a template is a ChatTemplateError naming
    the model file and where the template was looked for."""
    loaded = load_chat_template(source, template)
    if loaded is None:
        _, where, _ = _find_template(source)
        raise ChatTemplateError(
            f"{source.path}: the model has no chat template ({where} is absent) and none was given; pass one explicitly"
        )
    return loaded


def _find_template(source: Any) -> tuple[str | None, str, dict[str, str | None]]:
    """(template text or None, where it was looked for, special token names) of a source."""
    if source.kind == "gguf":
        meta = source.metadata
        tokens = meta.get("tokenizer.ggml.tokens") or []
        names = {}
        for role, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        ):
            token_id = meta.get(f"tokenizer.ggml.{key}")
            names[role] = tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None
        return meta.get("tokenizer.chat_template"), "GGUF key tokenizer.chat_template", names
    if source.kind == "safetensors":
        config = source.metadata.get("tokenizer_config") or {}
        names = {role: _token_name(config.get(role)) for role in _SPECIAL_TOKEN_ROLES}
        where = "chat_template.jinja and tokenizer_config.json chat_template"
        return _folder_template(Path(source.path), config), where, names
    raise ChatTemplateError(f"{source.path}: no chat template for a source of kind {source.kind!r}")
