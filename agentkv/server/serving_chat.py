"""POST /v1/chat/completions: messages -> prompt ids, tool_choice and response_format ->
grammar constraints, n engine requests -> one response, whole or streamed as SSE."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from agentkv.server.chat import render_chat
from agentkv.server.errors import bad_request
from agentkv.server.generation import ChoiceStreams, Job, collect, with_first
from agentkv.server.lifecycle import ServerState
from agentkv.server.logprobs import TokenText, chat_logprobs
from agentkv.server.responses import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse,
    ChatDelta, FunctionCallDelta, FunctionCallOut, PromptTokensDetails, ToolCallDelta, ToolCallOut,
    Usage, new_id, now)
from agentkv.server.prologue import Ask, ConstraintBuilder, build_jobs, open_request
from agentkv.server.schemas import ChatCompletionRequest
from agentkv.server.streaming import sse_response
from agentkv.server.tools import ToolCallStreamParser, parse_tool_calls


def _tool_setup(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]], str | dict[str, Any]]:
    """(tools as dicts, effective choice). A choice naming no given tool is a 400."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice: Any = req.tool_choice or ("auto" if tools else "none")
    if not isinstance(choice, str):
        name = choice.function.name
        match = [t for t in tools if t["function"]["name"] == name]
        if not match:
            raise bad_request(f"tool_choice names function {name!r}, which is not among tools "
                              f"{[t['function']['name'] for t in tools]}", param="tool_choice")
        return tools, match[0]
    if choice == "required" and not tools:
        raise bad_request("tool_choice 'required' needs a non-empty tools list", param="tool_choice")
    return tools, choice


def _constraint_builder(req: ChatCompletionRequest, tools: list[dict[str, Any]],
                        choice: Any) -> ConstraintBuilder | None:
    """A function factory -> fresh constraint (one per choice: grammar state is per request)."""
    if isinstance(choice, dict):
        return lambda f: f.tool_call([choice])
    if choice == "required":
        return lambda f: f.tool_call(tools)
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return lambda f: f.json_object()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise bad_request("response_format json_schema needs json_schema.schema",
                          param="response_format.json_schema")
    schema = fmt.json_schema.schema_
    return lambda f: f.json_schema(schema)


async def _jobs(state: ServerState, req: ChatCompletionRequest, engine: Any
                ) -> tuple[list[Job], bool]:
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
    tools, choice = _tool_setup(req)
    prompt = render_chat(engine.chat_template, req.messages,
                         tools=tools if choice != "none" else None,
                         add_generation_prompt=req.add_generation_prompt,
                         template_kwargs=req.chat_template_kwargs)
    prompt_ids = await asyncio.to_thread(engine.tokenizer.encode, prompt, False)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    ask = Ask([prompt_ids], max_tokens, param, (req.top_logprobs or 0) if req.logprobs else None,
              constraint=_constraint_builder(req, tools, choice))
    return await build_jobs(state, engine, req, ask, "chatcmpl"), choice != "none"


def _usage(outs: list[Any]) -> Usage:
    prompt_len = outs[0].prompt_len
    completion = sum(len(o.token_ids) for o in outs)
    cached = max(o.cached_len for o in outs)
    return Usage(prompt_tokens=prompt_len, completion_tokens=completion,
                 total_tokens=prompt_len + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest) -> Any:
    engine = open_request(state, req)
    jobs, parse_tools = await _jobs(state, req, engine)
    streams = ChoiceStreams(state, engine, jobs)
    if req.stream:
        return await sse_response(streams, lambda first: _chunks(state, req, streams, first, parse_tools))
    async with streams:
        last = await collect(streams)
    text_of = TokenText(engine.tokenizer)
    choices = []
    for index in sorted(last):
        out = last[index]
        content, calls = (parse_tool_calls(out.text) if parse_tools else (out.text, []))
        message = AssistantMessage(content=content, tool_calls=[
            ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments))
            for c in calls] or None)
        reason = "tool_calls" if calls else out.finish_reason
        logprobs = chat_logprobs(out.logprobs, text_of) if req.logprobs else None
        choices.append(ChatChoice(index=index, message=message, finish_reason=reason, logprobs=logprobs))
    return ChatCompletionResponse(id=jobs[0].request_id.rsplit("-", 1)[0], created=now(),
                                  model=state.model_name, choices=choices,
                                  usage=_usage([last[i] for i in sorted(last)]))


async def _chunks(state: ServerState, req: ChatCompletionRequest, streams: ChoiceStreams,
                  first: tuple[int, Any], parse_tools: bool) -> AsyncIterator[str]:
    """SSE payloads: a role chunk per choice, content/tool deltas, a finish chunk per choice,
    then usage (if asked). `first` is the output already pulled to validate the request."""
    chunk_id, created, model = new_id("chatcmpl"), now(), state.model_name
    text_of = TokenText(state.require_engine().tokenizer)
    parsers = {i: ToolCallStreamParser() for i in range(req.n)} if parse_tools else {}
    num_calls = {i: 0 for i in range(req.n)}
    finals: dict[int, Any] = {}

    def chunk(index: int, delta: ChatDelta, reason: Any = None, logprobs: Any = None) -> str:
        return ChatCompletionChunk(id=chunk_id, created=created, model=model, choices=[
            ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=logprobs)
        ]).model_dump_json()

    for i in range(req.n):
        yield chunk(i, ChatDelta(role="assistant", content=""))

    async for index, out in with_first(first, streams):
        logprobs = chat_logprobs(out.logprobs, text_of) if req.logprobs and out.logprobs else None
        events = parsers[index].feed(out.delta_text) if parse_tools else None
        if out.finished and parse_tools:
            events += parsers[index].finish()
        for delta in _deltas(out.delta_text, events, num_calls, index):
            yield chunk(index, delta, logprobs=logprobs)
            logprobs = None
        if logprobs is not None:
            yield chunk(index, ChatDelta(content=""), logprobs=logprobs)
        if out.finished:
            finals[index] = out
            reason = "tool_calls" if num_calls[index] else out.finish_reason
            yield chunk(index, ChatDelta(), reason=reason)
    if req.stream_options is not None and req.stream_options.include_usage:
        yield ChatCompletionChunk(id=chunk_id, created=created, model=model, choices=[],
                                  usage=_usage([finals[i] for i in sorted(finals)])).model_dump_json()


def _deltas(text: str, events: list[Any] | None, num_calls: dict[int, int], index: int) -> list[ChatDelta]:
    if events is None:
        return [ChatDelta(content=text)] if text else []
    deltas = []
    for event in events:
        if event.content:
            deltas.append(ChatDelta(content=event.content))
        elif event.call is not None:
            num_calls[index] += 1
            deltas.append(ChatDelta(tool_calls=[ToolCallDelta(
                index=event.index, id=event.call.id, type="function",
                function=FunctionCallDelta(name=event.call.name, arguments=event.call.arguments))]))
    return deltas

