"""POST /v1/responses (OpenAI Responses API): the request becomes chat messages (after the
history a previous_response_id names) and a ToolPolicy, then runs the shared path (prologue,
engine jobs, the one output reader); the answer is output items, whole or as the numbered
Responses event stream. A stored response (the default; `store: false` keeps nothing) is
what the next turn's previous_response_id continues."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from agentkv.server.chat import render_chat
from agentkv.server.errors import APIError
from agentkv.server.generation import ChoiceStreams, collect
from agentkv.server.guard import cache_namespace
from agentkv.server.lifecycle import ServerState
from agentkv.server.output_parser import OutputParser, OutputSpec, output_spec, parse_output
from agentkv.server.prologue import Ask, build_jobs, open_request
from agentkv.server.responses_objects import (
    EventWriter,
    FunctionCallOut,
    IncompleteDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningOut,
    ReasoningText,
    ResponseObject,
    item_id,
    usage_of,
)
from agentkv.server.responses_schemas import ResponsesRequest
from agentkv.server.responses_store import ResponseStore, StoredResponse
from agentkv.server.responses_stream import OutputItems
from agentkv.server.responses_translate import (
    check_served,
    input_messages,
    output_message,
    policy_of,
    response_format,
    sampling_fields,
    template_kwargs,
)
from agentkv.server.schemas import ChatMessage, ResponseFormat
from agentkv.server.serving_lora import echoed_model
from agentkv.server.streaming import sse_response
from agentkv.server.tool_policy import ToolPolicy, constraint_builder
from agentkv.server.tools import ParsedCall

log = logging.getLogger("agentkv.server")


class Prepared(NamedTuple):
    prompt_ids: list[int]
    spec: OutputSpec
    history: list[ChatMessage]  # earlier turns and this input, without the instructions
    fmt: ResponseFormat | None


async def _prepare(state: ServerState, store: ResponseStore, req: ResponsesRequest, engine: Any) -> Prepared:
    check_served(req)
    prior = store.previous(req.previous_response_id).history if req.previous_response_id else []
    history = prior + input_messages(req, prior)
    policy, fmt = policy_of(req), response_format(req)
    system = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    template = state.chat_template()
    # tool_choice "none" keeps the tools in the prompt: same prefix, same cache, no calls parsed.
    prompt = render_chat(template, system + history, tools=policy.tools or None, template_kwargs=template_kwargs(req))
    ids = await asyncio.to_thread(engine.tokenizer.encode, prompt, False)
    return Prepared(ids, output_spec(policy, state.output_formats(), prompt), history, fmt)


def _skeleton(model: str, req: ResponsesRequest, policy: ToolPolicy) -> ResponseObject:
    """The response as `response.created` shows it: the request echoed, no output yet."""
    choice: Any = policy.choice
    if isinstance(choice, dict):
        choice = {"type": "function", "name": choice["function"]["name"]}
    tools = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "description": t["function"].get("description"),
            "parameters": t["function"]["parameters"],
            "strict": False,
        }
        for t in policy.tools
    ]
    text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text is not None else None
    return ResponseObject(
        id=item_id("resp"),
        status="in_progress",
        model=model,
        instructions=req.instructions,
        parallel_tool_calls=policy.parallel,
        tool_choice=choice,
        tools=tools,
        temperature=req.temperature,
        top_p=req.top_p,
        max_output_tokens=req.max_output_tokens,
        previous_response_id=req.previous_response_id,
        text=text,
        store=req.store,
        metadata=req.metadata,
    )


async def create_response(
    state: ServerState, store: ResponseStore, req: ResponsesRequest, tenant: str | None = None
) -> Any:
    """The Responses API's answer to `req`, whole or streamed; `store` is the tenant's own."""
    fields = sampling_fields(req)
    engine = open_request(state, fields)
    prep = await _prepare(state, store, req, engine)
    policy = prep.spec.policy
    assert policy is not None
    ask = Ask(
        [prep.prompt_ids],
        req.max_output_tokens,
        "max_output_tokens",
        None,
        constraint=constraint_builder(policy, prep.fmt, prep.spec.tool_format),
        constraint_param="text.format",
        keep_special_tokens=prep.spec.keeps_special_tokens,
    )
    jobs = await build_jobs(state, engine, fields, ask, "resp", cache_namespace(tenant, None))
    body = _skeleton(echoed_model(state, engine, req), req, policy)
    streams = ChoiceStreams(state, engine, jobs)
    if req.stream:
        return await sse_response(
            streams,
            lambda: _events(store, req, streams, prep, body),
            named_events=True,
            keepalive_s=state.limits.sse_keepalive_s,
        )
    async with streams:
        out = (await collect(streams))[0]
    parsed = parse_output(out.text, prep.spec)
    incomplete = out.finish_reason == "length"
    items: list[OutputItem] = []
    if parsed.reasoning:
        items.append(ReasoningOut(id=item_id("rs"), status="completed", content=[ReasoningText(text=parsed.reasoning)]))
    if parsed.content or not parsed.calls:
        items.append(
            OutputMessage(
                id=item_id("msg"),
                status="incomplete" if incomplete else "completed",
                content=[OutputText(text=parsed.content or "")],
            )
        )
    items += [
        FunctionCallOut(id=item_id("fc"), call_id=c.id, name=c.name, arguments=c.arguments, status="completed")
        for c in parsed.calls
    ]
    return _finish(store, req, prep, body, out, items)


def _finish(
    store: ResponseStore, req: ResponsesRequest, prep: Prepared, body: ResponseObject, out: Any, items: list[OutputItem]
) -> ResponseObject:
    """The finished response (mutates `body`), stored for a later previous_response_id."""
    incomplete = out.finish_reason == "length"
    body.output = items
    body.status = "incomplete" if incomplete else "completed"
    body.incomplete_details = IncompleteDetails(reason="max_output_tokens") if incomplete else None
    body.usage = usage_of(out.prompt_len, out.cached_len, out.num_tokens)
    body.completed_at = int(time.time())
    if req.store:
        calls = [i for i in items if isinstance(i, FunctionCallOut)]
        text = "".join(p.text for i in items if isinstance(i, OutputMessage) for p in i.content)
        answer = output_message(text.strip() if calls else text, [_parsed(c) for c in calls])
        store.put(body.id, StoredResponse(prep.history + [answer], body))
    return body


def _parsed(item: FunctionCallOut) -> ParsedCall:
    return ParsedCall(item.call_id, item.name, item.arguments)


async def _events(
    store: ResponseStore, req: ResponsesRequest, streams: ChoiceStreams, prep: Prepared, body: ResponseObject
) -> AsyncIterator[str]:
    """response.created, response.in_progress, the output items, response.completed (or
    response.incomplete at max_output_tokens). An error after the 200 is an `error` event."""
    write = EventWriter()
    try:
        yield write("response.created", response=body.model_dump(mode="json"))
        yield write("response.in_progress", response=body.model_dump(mode="json"))
        parser, items = OutputParser(prep.spec), OutputItems(write)
        out = None
        async for _, out in streams:
            for ev in parser.feed(out.text) + (parser.finish() if out.finished else []):
                for frame in items.feed(ev):
                    yield frame
        incomplete = out.finish_reason == "length"
        for frame in items.finish(incomplete):
            yield frame
        final = _finish(store, req, prep, body, out, items.done)
        yield write(
            "response.incomplete" if incomplete else "response.completed", response=final.model_dump(mode="json")
        )
    except APIError as exc:
        yield write("error", code=exc.code or exc.type, message=exc.message, param=exc.param)
    except Exception as exc:  # a bug: logged with its trace, and the client told
        log.exception("responses stream failed")
        yield write("error", code="server_error", param=None, message=f"Internal server error: {type(exc).__name__}")
