"""POST /v1/chat/completions: messages -> prompt ids, tool_choice and response_format ->
grammar constraints, n engine requests -> one response, whole or streamed as SSE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agentkv.server.chat import render_chat
from agentkv.server.errors import bad_request
from agentkv.server.generation import ChoiceStreams, Job, collect
from agentkv.server.guard import cache_namespace
from agentkv.server.lifecycle import ServerState
from agentkv.server.logprobs import TokenText, chat_logprobs
from agentkv.server.output_parser import OutputEvent, OutputParser, OutputSpec, output_spec, parse_output
from agentkv.server.prologue import Ask, build_jobs, open_request
from agentkv.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    FunctionCallDelta,
    FunctionCallOut,
    PromptTokensDetails,
    ToolCallDelta,
    ToolCallOut,
    Usage,
    new_id,
    now,
)
from agentkv.server.route_tag import strip_messages
from agentkv.server.schemas import ChatCompletionRequest
from agentkv.server.serving_lora import echoed_model
from agentkv.server.streaming import sse_response
from agentkv.server.tool_policy import constraint_builder, tool_policy


def _template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return kwargs


async def _jobs(
    state: ServerState, req: ChatCompletionRequest, engine: Any, tenant: str | None
) -> tuple[list[Job], OutputSpec]:
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", param="top_logprobs")
    choice = req.tool_choice if isinstance(req.tool_choice, str | None) else req.tool_choice.model_dump()
    policy = tool_policy([t.model_dump(exclude_none=True) for t in req.tools or []], choice, req.parallel_tool_calls)
    # tool_choice "none" keeps the tools in the prompt: same prefix, same cache, no calls parsed.
    template = state.chat_template()
    prompt = render_chat(
        template,
        strip_messages(req.messages),  # the cluster front's routing tag (server/route_tag.py)
        tools=policy.tools or None,
        add_generation_prompt=req.add_generation_prompt,
        template_kwargs=_template_kwargs(req),
    )
    prompt_ids = await asyncio.to_thread(engine.tokenizer.encode, prompt, False)
    spec = output_spec(policy, state.output_formats(), prompt)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    ask = Ask(
        [prompt_ids],
        max_tokens,
        param,
        (req.top_logprobs or 0) if req.logprobs else None,
        constraint=constraint_builder(policy, req.response_format, spec.tool_format),
        keep_special_tokens=spec.keeps_special_tokens,
    )
    jobs = await build_jobs(state, engine, req, ask, "chatcmpl", cache_namespace(tenant, req.cache_salt))
    return jobs, spec


def _usage(outs: list[Any]) -> Usage:
    prompt_len = outs[0].prompt_len
    completion = sum(o.num_tokens for o in outs)
    cached = max(o.cached_len for o in outs)
    return Usage(
        prompt_tokens=prompt_len,
        completion_tokens=completion,
        total_tokens=prompt_len + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, tenant: str | None = None) -> Any:
    engine = open_request(state, req)
    jobs, spec = await _jobs(state, req, engine, tenant)
    streams = ChoiceStreams(state, engine, jobs)
    if req.stream:
        return await sse_response(
            streams, lambda: _chunks(state, req, streams, spec), keepalive_s=state.limits.sse_keepalive_s
        )
    async with streams:
        last = await collect(streams)
    text_of = TokenText(engine.tokenizer)
    choices = []
    for index in sorted(last):
        out = last[index]
        reasoning, content, calls = parse_output(out.text, spec)
        message = AssistantMessage(
            content=content,
            reasoning_content=reasoning,
            tool_calls=[
                ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments)) for c in calls
            ]
            or None,
        )
        reason = "tool_calls" if calls else out.finish_reason
        logprobs = chat_logprobs(out.logprobs, text_of) if req.logprobs else None
        choices.append(ChatChoice(index=index, message=message, finish_reason=reason, logprobs=logprobs))
    return ChatCompletionResponse(
        id=jobs[0].request_id.rsplit("-", 1)[0],
        created=now(),
        model=echoed_model(state, engine, req),
        choices=choices,
        usage=_usage([last[i] for i in sorted(last)]),
    )


async def _chunks(
    state: ServerState, req: ChatCompletionRequest, streams: ChoiceStreams, spec: OutputSpec
) -> AsyncIterator[str]:
    """SSE payloads: a role chunk per choice (at once, before any token), reasoning/content/
    tool deltas, a finish chunk per choice, then usage (if asked)."""
    chunk_id, created, model = new_id("chatcmpl"), now(), echoed_model(state, state.require_engine(), req)
    text_of = TokenText(state.require_engine().tokenizer)
    parsers = {i: OutputParser(spec) for i in range(req.n)}
    finals: dict[int, Any] = {}

    def chunk(index: int, delta: ChatDelta, reason: Any = None, logprobs: Any = None) -> str:
        return ChatCompletionChunk(
            id=chunk_id,
            created=created,
            model=model,
            choices=[ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=logprobs)],
        ).model_dump_json()

    for i in range(req.n):
        yield chunk(i, ChatDelta(role="assistant", content=""))

    async for index, out in streams:
        logprobs = chat_logprobs(out.logprobs, text_of) if req.logprobs and out.logprobs else None
        events = parsers[index].feed(out.text)
        if out.finished:
            events += parsers[index].finish()
        for delta in _deltas(events):
            yield chunk(index, delta, logprobs=logprobs)
            logprobs = None
        if logprobs is not None:
            yield chunk(index, ChatDelta(content=""), logprobs=logprobs)
        if out.finished:
            finals[index] = out
            reason = "tool_calls" if parsers[index].calls else out.finish_reason
            yield chunk(index, ChatDelta(), reason=reason)
    if req.stream_options is not None and req.stream_options.include_usage:
        yield ChatCompletionChunk(
            id=chunk_id, created=created, model=model, choices=[], usage=_usage([finals[i] for i in sorted(finals)])
        ).model_dump_json()


def _deltas(events: list[OutputEvent]) -> list[ChatDelta]:
    deltas = []
    for event in events:
        if event.kind == "reasoning":
            deltas.append(ChatDelta(reasoning_content=event.text))
        elif event.kind == "content":
            deltas.append(ChatDelta(content=event.text))
        elif event.kind == "call":  # the call's start: id and name (arguments may follow)
            deltas.append(
                ChatDelta(
                    tool_calls=[
                        ToolCallDelta(
                            index=event.index,
                            id=event.call.id,
                            type="function",
                            function=FunctionCallDelta(name=event.call.name, arguments=event.call.arguments),
                        )
                    ]
                )
            )
        else:
            deltas.append(
                ChatDelta(
                    tool_calls=[ToolCallDelta(index=event.index, function=FunctionCallDelta(arguments=event.text))]
                )
            )
    return deltas
