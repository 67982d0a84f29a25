"""What a request's tools, tool_choice, parallel_tool_calls and response_format mean for one
generation: the tools the prompt shows, the grammar (if any) decoding is held to, and which
calls the parser may return. Shared by every API that speaks tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from agentkv.server.errors import bad_request

# A grammar for "one or more calls" is a union of 1..N call sequences; N bounds its size.
MAX_PARALLEL_CALLS = 4


class ToolPolicy(NamedTuple):
    tools: list[dict[str, Any]]  # OpenAI function-tool dicts, rendered into the prompt
    choice: str | dict[str, Any]  # "none" | "auto" | "required" | the named tool's dict
    parallel: bool

    @property
    def parse(self) -> bool:
        """Whether calls are parsed out of the output ("none" keeps the tools, parses none)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def names(self) -> frozenset[str]:
        if isinstance(self.choice, dict):
            return frozenset({self.choice["function"]["name"]})
        return frozenset(t["function"]["name"] for t in self.tools)

    @property
    def max_calls(self) -> int | None:
        """A named choice is exactly one call (OpenAI: "call exactly one specific function"),
        as is `parallel_tool_calls: false`; otherwise any number."""
        return None if self.parallel and not isinstance(self.choice, dict) else 1

    def grammar_calls(self) -> int:
        return MAX_PARALLEL_CALLS if self.max_calls is None else 1


def tool_policy(tools: list[dict[str, Any]], choice: Any, parallel: bool | None) -> ToolPolicy:
    """Check the choice against the tools. A choice naming no given tool is a 400."""
    choice = choice or ("auto" if tools else "none")
    parallel = True if parallel is None else parallel
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        match = [t for t in tools if t["function"]["name"] == name]
        if not match:
            raise bad_request(
                f"tool_choice names function {name!r}, which is not among tools "
                f"{[t['function']['name'] for t in tools]}",
                param="tool_choice",
            )
        return ToolPolicy(tools, match[0], parallel)
    if choice == "required" and not tools:
        raise bad_request("tool_choice 'required' needs a non-empty tools list", param="tool_choice")
    return ToolPolicy(tools, choice, parallel)


def constraint_builder(policy: ToolPolicy, fmt: Any, tool_format: Any = None) -> Callable[[Any], Any] | None:
    """ConstraintFactory -> a fresh constraint, or None for free decoding. `fmt` is a
    response_format-like object (type, json_schema.schema_) or None; `tool_format` the
    model's ToolFormat (None or Hermes: the Hermes grammar), whose own syntax calls are
    held to.

    Under "auto" with tools and a JSON format the output is held to the union: tool calls, or
    the format's JSON (vLLM imposes the format alone, and no agent can then call a tool)."""
    if isinstance(policy.choice, dict) or policy.choice == "required":
        return _calls(policy, [policy.choice] if isinstance(policy.choice, dict) else policy.tools, tool_format)
    if fmt is None or fmt.type == "text":
        return _strict_calls(policy, tool_format)
    if fmt.type == "json_object":
        schema: dict[str, Any] = {"type": "object"}
    elif fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise bad_request("response_format json_schema needs json_schema.schema", param="response_format.json_schema")
    else:
        schema = fmt.json_schema.schema_
    if policy.parse:
        return _calls(policy, policy.tools, tool_format, schema)
    return lambda f: f.json_schema(schema)


def _strict_calls(policy: ToolPolicy, tool_format: Any) -> Callable[[Any], Any] | None:
    """`strict: true` tools under "auto": text stays free, but a call, once begun (its marker,
    its section's marker, or where a format has none, its head), follows the family's grammar."""
    if not policy.parse or not any(t["function"].get("strict") for t in policy.tools):
        return None
    from agentkv.server.toolformats.registry import get_format

    found = (tool_format or get_format("hermes")).strict_calls(policy.tools)
    if found is None:
        return None
    triggers, tags = found
    return lambda f: f.triggered_calls(triggers, tags)


def _calls(
    policy: ToolPolicy, tools: list[dict[str, Any]], tool_format: Any, or_schema: dict[str, Any] | None = None
) -> Callable[[Any], Any]:
    """Calls in the model's own syntax (Hermes by default), spaced as templates write them
    back, so the next turn's prompt starts with exactly the generated text."""
    from agentkv.server.toolformats.registry import get_format

    calls = policy.grammar_calls()
    plan = (tool_format or get_format("hermes")).grammar(tools)
    return lambda f: f.call_grammar(plan, calls, or_schema)
