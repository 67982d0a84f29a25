"""Constrained decoding on xgrammar: the `Constraint` protocol the engine calls each step, and a
per-tokenizer factory that compiles (and caches) grammars for JSON schemas, `json_object`, and
Hermes tool calls (`<tool_call>{"name": one of the tools, "arguments": its schema}</tool_call>`).

The engine owns the loop; for a request with a constraint it does, every step:

    mask = c.allowed_mask()      # bool[vocab_size] (model logits width) or None = no limit
    ... sample among mask ...
    c.accept(token_id)
    if c.is_finished(): stop with finish_reason "stop"

Ids the tokenizer does not know (model logits wider than the vocabulary) and special tokens
are never allowed; a grammar ends the request itself, so EOS is never needed to close JSON.
xgrammar is imported in the factory only, so the core imports without it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from agentkv.runtime.structural_tags import schemas_in, tag_format

log = logging.getLogger("agentkv.structured")

TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"
_CACHE_SIZE = 64


class Constraint(Protocol):
    def allowed_mask(self) -> np.ndarray | None: ...

    def accept(self, token_id: int) -> None: ...

    def is_finished(self) -> bool: ...


class GrammarConstraint:
    """One request's grammar state. Not thread-safe: only the engine thread calls it."""

    def __init__(self, compiled: Any, vocab_size: int, *, ends_on_stop_token: bool = False) -> None:
        import xgrammar as xgr

        # A grammar that may go on after a complete match (one call or more) ends on EOS.
        self._matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=not ends_on_stop_token)
        self._vocab_size = vocab_size
        self._bitmask = np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)
        self._mask: np.ndarray | None = None
        self._failed = False

    def allowed_mask(self) -> np.ndarray:
        """bool[vocab_size]; True where the grammar allows the token next. Cached until accept."""
        if self._mask is None:
            self._bitmask.fill(0)
            self._matcher.fill_next_token_bitmask(self._bitmask)
            bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
            self._mask = bits[: self._vocab_size].astype(bool)
        return self._mask

    def accept(self, token_id: int) -> None:
        """Advance the grammar by one sampled token (mutates). A token the mask forbade means
        the engine ignored the mask: the request is ended rather than the thread crashed."""
        self._mask = None
        if not self._matcher.accept_token(int(token_id)):
            log.error("grammar rejected token %d: the engine sampled outside the mask (bug)", token_id)
            self._failed = True

    def is_finished(self) -> bool:
        return self._failed or self._matcher.is_terminated()


def tool_call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """JSON schema of one call: {"name": <one tool>, "arguments": <that tool's parameters>}.
    `tools` are OpenAI tool definitions ({"type": "function", "function": {...}})."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


class ConstraintFactory:
    """Compiles grammars for one tokenizer and model width; thread-safe, caches by schema.

    Building is CPU work (tens of ms to seconds): call from a worker thread, not the loop."""

    def __init__(self, tokenizer: Any, vocab_size: int, keep_tokens: frozenset[str] = frozenset()) -> None:
        """`keep_tokens`: special tokens a grammar may generate by their text (a family's
        tool-call markers, `[TOOL_CALLS]`, `<|channel|>`, ...); every other one never."""
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        info = _tokenizer_info(tokenizer, vocab_size, keep_tokens)
        self._markers = _marker_ids(tokenizer, vocab_size, keep_tokens)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def json_schema(self, schema: dict[str, Any]) -> GrammarConstraint:
        """Output is one JSON value valid against `schema`. Raises ValueError if unsupported,
        or if the schema admits nothing (an empty anyOf/oneOf/enum, `false`)."""
        check_admits_something(schema)
        return self._make(("schema", schema), lambda: self._compile_schema(schema))

    def json_object(self) -> GrammarConstraint:
        """Output is one JSON object, any keys."""
        return self.json_schema({"type": "object"})

    def tool_call(
        self, tools: Sequence[dict[str, Any]], max_calls: int = 1, or_schema: dict[str, Any] | None = None
    ) -> GrammarConstraint:
        """Output is 1 to `max_calls` `<tool_call>` blocks (newline-separated), each calling one
        of `tools` (pass a single tool for a named tool_choice) with arguments valid against its
        parameters schema -- or, given `or_schema`, one JSON value valid against it instead.
        With max_calls > 1 or an alternative the model ends the output with EOS."""
        if max_calls < 1:
            raise ValueError(f"max_calls={max_calls} is out of range: allowed an int >= 1")
        schema = tool_call_schema(tools)
        check_admits_something(schema)
        if or_schema is not None:
            check_admits_something(or_schema)
        return self._make(
            ("tool", schema, max_calls, or_schema),
            lambda: self._compile_tool_call(schema, max_calls, or_schema),
            max_calls > 1 or or_schema is not None,
        )

    def call_grammar(self, plan: Any, max_calls: int = 1, or_schema: dict[str, Any] | None = None) -> GrammarConstraint:
        """Output is `plan.begin`, 1 to `max_calls` calls joined by `plan.sep`, `plan.end`: each
        call one of `plan.calls`, a list of pieces ("lit", text) | ("json", schema) |
        ("ebnf", rule body) | ("regex", pattern) -- a family's own call syntax (toolformats' CallGrammar). Given
        `or_schema`, one JSON value valid against it instead."""
        if max_calls < 1:
            raise ValueError(f"max_calls={max_calls} is out of range: allowed an int >= 1")
        for pieces in plan.calls:
            for kind, value in pieces:
                if kind == "json":
                    check_admits_something(value)
        return self._make(
            ("plan", list(plan), max_calls, or_schema),
            lambda: self._compile_plan(plan, max_calls, or_schema),
            max_calls > 1 or or_schema is not None,
        )

    def triggered_calls(self, triggers: Sequence[str], tags: Sequence[tuple[str, list[Any], str]]) -> GrammarConstraint:
        """Free text, in which each call opened by one of `triggers` must be one of `tags`
        (begin, pieces as in `call_grammar` -- or ("tags", (tags, sep)), ("star", pieces),
        ("or", [pieces, ...]) -- end): xgrammar's triggered structural tags. Ends on EOS."""
        for _, pieces, _ in tags:
            for schema in schemas_in(pieces):
                check_admits_something(schema)
        spec = {
            "type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": list(triggers), "tags": [tag_format(t) for t in tags]},
        }

        def build() -> Any:
            try:
                return self._compiler.compile_grammar(self._xgr.Grammar.from_structural_tag(json.dumps(spec)))
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError variants
                raise ValueError(f"tool parameters schema is not supported: {exc}") from exc

        return self._make(("triggered", spec), build, True)

    def _compile_plan(self, plan: Any, max_calls: int, or_schema: dict[str, Any] | None) -> Any:
        xgr = self._xgr

        def lit(text: str) -> list[Any]:
            return [xgr.Grammar.from_ebnf(f"root ::= {literal_rule(text, self._markers)}")] if text else []

        def piece(kind: str, value: Any) -> list[Any]:
            if kind == "lit":
                return lit(value)
            if kind == "json":  # spaced as json.dumps and templates' tojson write it back
                return [xgr.Grammar.from_json_schema(json.dumps(value), any_whitespace=False, separators=(", ", ": "))]
            if kind == "regex":
                return [xgr.Grammar.from_regex(value)]
            return [xgr.Grammar.from_ebnf(f"root ::= {value}")]

        try:
            calls = [xgr.Grammar.concat(*[g for k, v in pieces for g in piece(k, v)]) for pieces in plan.calls]
            one = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
            sep = lit(plan.sep)[0] if plan.sep else None
            options = [
                xgr.Grammar.concat(*lit(plan.begin), *_repeat([one], sep, k), *lit(plan.end))
                for k in range(1, max_calls + 1)
            ]
            if or_schema is not None:
                options.append(xgr.Grammar.from_json_schema(json.dumps(or_schema), any_whitespace=False))
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError variants
            raise ValueError(f"tool parameters schema is not supported: {exc}") from exc
        return self._compiler.compile_grammar(options[0] if len(options) == 1 else xgr.Grammar.union(*options))

    def _make(self, key_obj: Any, build: Any, ends_on_stop_token: bool = False) -> GrammarConstraint:
        key = json.dumps(key_obj, sort_keys=True)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
        if compiled is None:
            compiled = build()
            _check_first_mask(compiled, self.vocab_size)
            with self._lock:
                self._cache[key] = compiled
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return GrammarConstraint(compiled, self.vocab_size, ends_on_stop_token=ends_on_stop_token)

    def _compile_schema(self, schema: dict[str, Any]) -> Any:
        try:
            return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError variants
            raise ValueError(f"JSON schema is not supported for constrained decoding: {exc}") from exc

    def _compile_tool_call(
        self, schema: dict[str, Any], max_calls: int, or_schema: dict[str, Any] | None = None
    ) -> Any:
        xgr = self._xgr
        try:
            body = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
            alternative = (
                [] if or_schema is None else [xgr.Grammar.from_json_schema(json.dumps(or_schema), any_whitespace=False)]
            )
        except Exception as exc:
            raise ValueError(f"tool parameters schema is not supported: {exc}") from exc
        parts = [
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(TOOL_CALL_OPEN)}"),
            body,
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(TOOL_CALL_CLOSE)}"),
        ]
        sep = xgr.Grammar.from_ebnf('root ::= "\\n"')
        options = [xgr.Grammar.concat(*_repeat(parts, sep, k)) for k in range(1, max_calls + 1)] + alternative
        grammar = options[0] if len(options) == 1 else xgr.Grammar.union(*options)
        return self._compiler.compile_grammar(grammar)


def check_admits_something(schema: Any) -> None:
    """Raise ValueError when `schema` can never be satisfied (conservative: only what is
    certain): `false`, an empty `enum`, an `anyOf`/`oneOf` none of whose options can be,
    an `allOf` with one that cannot, a required property or the items of a non-empty array
    that cannot. Such a grammar has no first token, or leads the request into a dead end
    mid-output, so it is refused when the request is added."""
    where = _unsatisfiable(schema, "schema")
    if where is not None:
        raise ValueError(f"{where} admits no JSON value, so nothing can be generated for it")


def _unsatisfiable(schema: Any, path: str) -> str | None:
    """The path of a part that makes `schema` unsatisfiable, or None."""
    if schema is False:
        return path
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and not schema["enum"]:
        return f"{path}.enum (empty)"
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            inner = [_unsatisfiable(o, f"{path}.{key}[{i}]") for i, o in enumerate(options)]
            if all(inner):
                return f"{path}.{key} (empty)" if not options else f"{path}.{key}"
    parts = [(o, f"{path}.allOf[{i}]") for i, o in enumerate(schema.get("allOf") or ())]
    props = schema.get("properties")
    if isinstance(props, dict):
        parts += [(props[name], f"{path}.properties.{name}") for name in schema.get("required") or () if name in props]
    if isinstance(schema.get("items"), dict) and (schema.get("minItems") or 0) > 0:
        parts.append((schema["items"], f"{path}.items"))
    for part, part_path in parts:
        found = _unsatisfiable(part, part_path)
        if found is not None:
            return found
    return None


def _check_first_mask(compiled: Any, vocab_size: int) -> None:
    """A compiled grammar must allow some first token (or be complete already)."""
    probe = GrammarConstraint(compiled, vocab_size)
    if not probe.is_finished() and not probe.allowed_mask().any():
        raise ValueError("the grammar admits no output: no token can start it")


def _marker_ids(tokenizer: Any, vocab_size: int, keep_tokens: frozenset[str]) -> dict[str, int]:
    """The special tokens among `keep_tokens`, by text: ids a call's literal writes them as."""
    ids = {t: tokenizer.token_to_id(t) for t in keep_tokens}
    special = set(getattr(tokenizer, "special_ids", ()))
    return {t: i for t, i in ids.items() if i is not None and i in special and i < vocab_size}


def literal_rule(text: str, markers: dict[str, int]) -> str:
    """An EBNF body for the literal `text` in which each marker (`markers`: text -> special
    token id) is that one token, `Token(id)`, and the rest is strings: a forced call writes
    `<|channel|>` as the token the tokenizer makes of it, never spelled out in bytes, so its
    tokens are the ones the next prompt holds when the chat template renders the call back."""
    if not markers:
        return json.dumps(text, ensure_ascii=False)
    pattern = "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True))
    parts = [p for p in re.split(f"({pattern})", text) if p]
    return " ".join(f"Token({markers[p]})" if p in markers else json.dumps(p, ensure_ascii=False) for p in parts)


def _repeat(parts: list[Any], sep: Any, k: int) -> list[Any]:
    """`parts` k times, `sep` (unless None) between."""
    out: list[Any] = []
    for i in range(k):
        out += ([sep] if i and sep is not None else []) + parts
    return out


def _tokenizer_info(tokenizer: Any, vocab_size: int, keep_tokens: frozenset[str] = frozenset()) -> Any:
    """xgrammar's view of the vocabulary. Special tokens become empty strings, which xgrammar
    never allows, except those in `keep_tokens` (tool-call markers); the vocab type
    (byte-level BPE, byte-fallback SentencePiece) is detected from
    the `tokenizers` backend when there is one."""
    import xgrammar as xgr

    num_known = min(tokenizer.vocab_size, vocab_size)
    special = set(getattr(tokenizer, "special_ids", ()))
    vocab = [tokenizer.id_to_token(i) or "" for i in range(num_known)]
    vocab = ["" if i in special and vocab[i] not in keep_tokens else vocab[i] for i in range(num_known)]
    meta: dict[str, Any] = {"vocab_type": xgr.VocabType.RAW, "add_prefix_space": False}
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    return xgr.TokenizerInfo(
        vocab,
        meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=sorted(tokenizer.eos_ids),
        add_prefix_space=meta["add_prefix_space"],
    )


class MinTokensConstraint:
    """min_tokens: the ids in `banned` (EOS and stop token ids) are forbidden until
    `min_tokens` tokens have been generated; `inner` (a grammar, or None) applies throughout.
    Where the two leave nothing (a grammar that may only end on EOS), the grammar wins, since
    a row with every token masked cannot be sampled. Not thread-safe: the engine thread only."""

    def __init__(self, inner: Constraint | None, banned: Sequence[int], vocab_size: int, min_tokens: int) -> None:
        self._inner, self._min_tokens, self._num_tokens = inner, min_tokens, 0
        self._ban = np.ones(vocab_size, dtype=bool)
        self._ban[[i for i in banned if 0 <= i < vocab_size]] = False

    def allowed_mask(self) -> np.ndarray | None:
        inner = self._inner.allowed_mask() if self._inner is not None else None
        if self._num_tokens >= self._min_tokens:
            return inner
        if inner is None:
            return self._ban
        both = inner & self._ban
        return both if both.any() else inner

    def accept(self, token_id: int) -> None:
        self._num_tokens += 1
        if self._inner is not None:
            self._inner.accept(token_id)

    def is_finished(self) -> bool:
        return self._inner is not None and self._inner.is_finished()
