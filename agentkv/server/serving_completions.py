"""POST /v1/completions: string, token-id and batched prompts, n samples each, `echo` with
prompt logprobs (what likelihood-scoring clients such as lm-evaluation-harness send:
`echo=true, logprobs=k, max_tokens=0|1`), whole or streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentkv.server.errors import bad_request
from agentkv.server.generation import ChoiceStreams, Job, collect
from agentkv.server.guard import cache_namespace
from agentkv.server.lifecycle import ServerState
from agentkv.server.logprobs import TokenText, completion_logprobs
from agentkv.server.prologue import Ask, build_jobs, open_request, prompt_id_lists
from agentkv.server.responses import CompletionChoice, CompletionResponse, PromptTokensDetails, Usage, new_id, now
from agentkv.server.route_tag import strip_prompt
from agentkv.server.schemas import CompletionRequest
from agentkv.server.serving_lora import echoed_model
from agentkv.server.streaming import sse_response


async def _jobs(
    state: ServerState, req: CompletionRequest, engine: Any, tenant: str | None
) -> tuple[list[Job], list[list[int]]]:
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of={req.best_of} is not supported; only best_of == n", param="best_of")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens=0 is only meaningful with echo=true", param="max_tokens")
    prompt = strip_prompt(req.prompt)  # the cluster front's routing tag (server/route_tag.py)
    prompts = await prompt_id_lists(engine, prompt, req.add_special_tokens)
    # max_tokens=0 (score the prompt only) runs one token and drops it.
    ask = Ask(
        prompts,
        req.max_tokens if req.max_tokens != 0 else 1,
        "max_tokens",
        req.logprobs,
        prompt_logprobs=req.logprobs if (req.echo and req.logprobs is not None) else None,
    )
    namespace = cache_namespace(tenant, req.cache_salt)
    return await build_jobs(state, engine, req, ask, "cmpl", namespace), prompts


def _choice(
    req: CompletionRequest, index: int, out: Any, prompt_ids: list[int], text_of: TokenText
) -> CompletionChoice:
    keep = req.max_tokens != 0
    prompt_text = text_of.tokenizer_decode(prompt_ids) if req.echo else ""
    text = prompt_text + (out.text if keep else "")
    logprobs = None
    if req.logprobs is not None:
        if req.echo:
            entries = out.prompt_logprobs or [None] * len(prompt_ids)
            logprobs = completion_logprobs(entries, prompt_ids, text_of)
        if keep:
            logprobs = completion_logprobs(
                out.logprobs or [], out.token_ids, text_of, start_offset=len(prompt_text), into=logprobs
            )
        elif logprobs is None:
            logprobs = completion_logprobs([], [], text_of)
    reason = out.finish_reason if keep else "length"
    return CompletionChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs)


def _usage(outs: dict[int, Any], n: int, keep: bool) -> Usage:
    prompt = sum(o.prompt_len for i, o in outs.items() if i % n == 0)
    completion = sum(o.num_tokens for o in outs.values()) if keep else 0
    cached = sum(o.cached_len for i, o in outs.items() if i % n == 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


async def create_completion(state: ServerState, req: CompletionRequest, tenant: str | None = None) -> Any:
    engine = open_request(state, req)
    jobs, prompts = await _jobs(state, req, engine, tenant)
    streams = ChoiceStreams(state, engine, jobs)
    text_of = TokenText(engine.tokenizer)
    if req.stream:
        return await sse_response(
            streams, lambda: _chunks(state, req, streams, prompts, text_of), keepalive_s=state.limits.sse_keepalive_s
        )
    async with streams:
        last = await collect(streams)
    choices = [_choice(req, i, last[i], prompts[i // req.n], text_of) for i in sorted(last)]
    return CompletionResponse(
        id=jobs[0].request_id.rsplit("-", 1)[0],
        created=now(),
        model=echoed_model(state, engine, req),
        choices=choices,
        usage=_usage(last, req.n, req.max_tokens != 0),
    )


async def _chunks(
    state: ServerState, req: CompletionRequest, streams: ChoiceStreams, prompts: list[list[int]], text_of: TokenText
) -> AsyncIterator[str]:
    chunk_id, created, model = new_id("cmpl"), now(), echoed_model(state, state.require_engine(), req)
    keep = req.max_tokens != 0
    finals: dict[int, Any] = {}
    echoed: set[int] = set()

    async for index, out in streams:
        prompt_ids = prompts[index // req.n]
        text, logprobs = (out.text, None) if keep else ("", None)
        if req.logprobs is not None and keep:
            logprobs = completion_logprobs(out.logprobs or [], out.token_ids, text_of)
        if req.echo and index not in echoed:
            echoed.add(index)
            text = text_of.tokenizer_decode(prompt_ids) + text
            if req.logprobs is not None:
                entries = out.prompt_logprobs or [None] * len(prompt_ids)
                pre = completion_logprobs(entries, prompt_ids, text_of)
                logprobs = completion_logprobs(out.logprobs or [], out.token_ids if keep else [], text_of, into=pre)
        if out.finished:
            finals[index] = out
        reason = (out.finish_reason if keep else "length") if out.finished else None
        if text or reason or logprobs:
            yield CompletionResponse(
                id=chunk_id,
                created=created,
                model=model,
                choices=[CompletionChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs)],
            ).model_dump_json()
    if req.stream_options is not None and req.stream_options.include_usage:
        yield CompletionResponse(
            id=chunk_id, created=created, model=model, choices=[], usage=_usage(finals, req.n, keep)
        ).model_dump_json()
