"""POST /v1/messages and /v1/messages/count_tokens (Anthropic): the request becomes chat
messages and a ToolPolicy, then runs the shared path (prologue, engine jobs, the one output
reader); the answer is content blocks, whole or as Anthropic's event stream. After a request
the prefix up to each cache_control breakpoint is pinned in the radix cache for its TTL."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Hashable
from typing import Any, NamedTuple

from agentkv.cache.radix import common_prefix_len
from agentkv.server.anthropic_responses import CountTokensResponse, MessageResponse, event, usage_of
from agentkv.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from agentkv.server.anthropic_translate import conversation, policy_of, sampling_fields, stop_reason
from agentkv.server.chat import render_chat
from agentkv.server.errors import APIError
from agentkv.server.generation import ChoiceStreams, Job, collect
from agentkv.server.guard import cache_namespace
from agentkv.server.lifecycle import ServerState
from agentkv.server.output_parser import OutputParser, OutputSpec, output_spec, parse_output
from agentkv.server.prologue import Ask, build_jobs, open_request
from agentkv.server.serving_lora import echoed_model
from agentkv.server.streaming import sse_response
from agentkv.server.tool_policy import constraint_builder
from agentkv.server.translate import check_model

log = logging.getLogger("agentkv.server")


class Prepared(NamedTuple):
    engine: Any
    prompt_ids: list[int]
    spec: OutputSpec
    pins: list[tuple[int, float]]  # (prefix length, ttl_s) per cache_control breakpoint
    namespace: Hashable = None  # the tenant's cache (and adapter's), where the pins go too
    model: str = ""  # the model the response names


def thinking_kwargs(thinking: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's `thinking` as the variables thinking templates read: `enable_thinking`
    (Qwen3, GLM, DeepSeek V3.1's `thinking`) and the budget as `thinking_budget`."""
    if not thinking or thinking.get("type") not in ("enabled", "disabled"):
        return {}
    enabled = thinking["type"] == "enabled"
    kwargs: dict[str, Any] = {"enable_thinking": enabled, "thinking": enabled}
    if enabled and isinstance(thinking.get("budget_tokens"), int):
        kwargs["thinking_budget"] = thinking["budget_tokens"]
    return kwargs


async def _prepare(
    state: ServerState, req: MessagesRequest | CountTokensRequest, engine: Any, with_pins: bool = True
) -> Prepared:
    conv, policy = conversation(req), policy_of(req)
    template = state.chat_template()
    tools = policy.tools or None
    kwargs = thinking_kwargs(req.thinking)
    heads = sorted({bp.num_messages for bp in conv.breakpoints}) if with_pins else []

    def render() -> tuple[str, list[int], dict[int, list[int] | None]]:
        """Off the event loop: the prompt and each distinct breakpoint head, rendered once."""
        prompt = render_chat(template, conv.messages, tools=tools, template_kwargs=kwargs)
        head_ids: dict[int, list[int] | None] = {}
        for num in heads:
            try:
                head = render_chat(
                    template, conv.messages[:num], tools=tools, add_generation_prompt=False, template_kwargs=kwargs
                )
            except APIError as exc:  # a template that refuses a partial conversation
                log.info("cache_control breakpoint not pinned: %s", exc.message)
                head_ids[num] = None
                continue
            head_ids[num] = engine.tokenizer.encode(head, False)
        return prompt, engine.tokenizer.encode(prompt, False), head_ids

    prompt, ids, head_ids = await asyncio.to_thread(render)
    pins = [
        (common_prefix_len(head_ids[bp.num_messages], ids), bp.ttl_s)
        for bp in conv.breakpoints
        if with_pins and head_ids.get(bp.num_messages) is not None
    ]
    return Prepared(engine, ids, output_spec(policy, state.output_formats(), prompt), pins)


async def count_tokens(state: ServerState, req: CountTokensRequest) -> CountTokensResponse:
    engine = check_model(state, req.model)
    return CountTokensResponse(input_tokens=len((await _prepare(state, req, engine, with_pins=False)).prompt_ids))


async def _pin(prep: Prepared) -> int:
    """Pin each breakpoint's prefix (it is in the cache now that the request ran)."""
    pinned = 0
    for length, ttl_s in prep.pins:
        if length:
            pinned = max(pinned, await prep.engine.pin_prefix(prep.prompt_ids[:length], prep.namespace, ttl_s))
    return pinned


async def create_message(state: ServerState, req: MessagesRequest, tenant: str | None = None) -> Any:
    fields = sampling_fields(req)
    engine = open_request(state, fields)
    prep = (await _prepare(state, req, engine))._replace(namespace=cache_namespace(tenant, None))
    policy = prep.spec.policy
    ask = Ask(
        [prep.prompt_ids],
        req.max_tokens,
        "max_tokens",
        None,
        constraint=constraint_builder(policy, None, prep.spec.tool_format),
        keep_special_tokens=prep.spec.keeps_special_tokens,
    )
    jobs = await build_jobs(state, engine, fields, ask, "msg", prep.namespace)
    prep = prep._replace(namespace=jobs[0].namespace, model=echoed_model(state, engine, req))  # the adapter's
    streams = ChoiceStreams(state, engine, jobs)
    if req.stream:
        return await sse_response(
            streams,
            lambda: _events(state, req, streams, prep, jobs),
            named_events=True,
            keepalive_s=state.limits.sse_keepalive_s,
        )
    async with streams:
        out = (await collect(streams))[0]
    pinned = await _pin(prep)
    parsed = parse_output(out.text, prep.spec)
    content: list[dict[str, Any]] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content:
        content.append({"type": "text", "text": parsed.content})
    content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in parsed.calls]
    reason, sequence = stop_reason(out, len(parsed.calls), req.stop_sequences)
    return MessageResponse(
        id=_message_id(jobs),
        model=prep.model,
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage_of(out.prompt_len, out.cached_len, pinned, out.num_tokens),
    )


def _input(arguments: str) -> dict[str, Any]:
    """A call's input object; a call cut off by max_tokens has no whole JSON: empty input."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        log.info("tool_use input cut off: %r", arguments[:80])
        return {}
    return value if isinstance(value, dict) else {}


def _message_id(jobs: list[Job]) -> str:
    return jobs[0].request_id.rsplit("-", 1)[0]


class _Blocks:
    """The open content block of a stream (mutates): text, thinking or tool_use, one at a
    time, each started and stopped with its own events. Leading whitespace of a text block is
    held until real text follows, so a tool call's preamble newline makes no empty block."""

    def __init__(self) -> None:
        self.index, self.kind, self.held = -1, "", ""

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        frames = self.close()
        self.index, self.kind = self.index + 1, kind
        return frames + [event("content_block_start", {"index": self.index, "content_block": block})]

    def close(self) -> list[str]:
        if not self.kind:
            return []
        self.kind = ""
        return [event("content_block_stop", {"index": self.index})]

    def feed(self, ev: Any) -> list[str]:
        frames: list[str] = []
        if ev.kind == "content":
            text = self.held + ev.text
            if self.kind != "text" and not text.strip():
                self.held = text
                return []
            self.held = ""
            if self.kind != "text":
                frames += self._open("text", {"type": "text", "text": ""})
            return frames + [self._delta({"type": "text_delta", "text": text})]
        if ev.kind == "reasoning":
            if self.kind != "thinking":
                frames += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return frames + [self._delta({"type": "thinking_delta", "thinking": ev.text})]
        if ev.kind == "call":
            self.held = ""
            frames += self._open("tool_use", {"type": "tool_use", "id": ev.call.id, "name": ev.call.name, "input": {}})
            text = ev.call.arguments
        else:
            text = ev.text
        return frames + ([self._delta({"type": "input_json_delta", "partial_json": text})] if text else [])

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self.index, "delta": delta})


async def _events(
    state: ServerState, req: MessagesRequest, streams: ChoiceStreams, prep: Prepared, jobs: list[Job]
) -> AsyncIterator[str]:
    """message_start (with the first output: its usage knows the cache hit), ping, the
    content blocks, message_delta (stop reason, usage), message_stop."""
    parser, blocks = OutputParser(prep.spec), _Blocks()
    try:
        _, first = await anext(aiter(streams))
    except StopAsyncIteration:
        return
    start = usage_of(first.prompt_len, first.cached_len, 0, 0).model_dump()
    yield event(
        "message_start",
        {
            "message": {
                "id": _message_id(jobs),
                "type": "message",
                "role": "assistant",
                "model": prep.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start,
            }
        },
    )
    yield event("ping", {})
    out = first
    async for out in _then(first, streams):
        events = parser.feed(out.text) + (parser.finish() if out.finished else [])
        for ev in events:
            for frame in blocks.feed(ev):
                yield frame
    for frame in blocks.close():
        yield frame
    pinned = await _pin(prep)
    reason, sequence = stop_reason(out, len(parser.calls), req.stop_sequences)
    usage = usage_of(out.prompt_len, out.cached_len, pinned, out.num_tokens).model_dump()
    yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage})
    yield event("message_stop", {})


async def _then(first: Any, streams: ChoiceStreams) -> AsyncIterator[Any]:
    """`first` (the output message_start was built from), then the rest of `streams`."""
    yield first
    async for _, out in streams:
        yield out
