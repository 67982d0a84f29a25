"""The request prologue chat and completions share: model check, prompt tokens, max_tokens
fitted per prompt, one SamplingParams and one fresh grammar constraint per choice, and the
engine jobs that carry them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from agentkv.runtime.client import EngineClient
from agentkv.runtime.structured import MinTokensConstraint
from agentkv.server.errors import bad_request
from agentkv.server.generation import Job
from agentkv.server.lifecycle import ServerState
from agentkv.server.responses import new_id
from agentkv.server.schemas import SamplingFields
from agentkv.server.serving_lora import request_adapter
from agentkv.server.translate import check_min_tokens, check_model, check_tokens, fit_max_tokens, sampling_params

MAX_N = 16
MAX_PROMPTS = 256

ConstraintBuilder = Callable[[Any], Any]  # ConstraintFactory -> a fresh constraint


class Ask(NamedTuple):
    """What an endpoint asks of the prologue once it has its prompt ids."""

    prompts: list[list[int]]
    max_tokens: int | None
    max_tokens_param: str
    logprobs: int | None
    prompt_logprobs: int | None = None
    constraint: ConstraintBuilder | None = None
    constraint_param: str = "response_format"
    keep_special_tokens: bool = False  # tools are parsed: special tokens stay in the text


def open_request(state: ServerState, req: SamplingFields) -> EngineClient:
    """The engine for a generation request: the model is served, generates text, and n fits."""
    engine = check_model(state, req.model)
    if engine.is_embedding:
        raise bad_request("This model produces embeddings; use /v1/embeddings", param="model")
    if not 1 <= req.n <= MAX_N:
        raise bad_request(f"n={req.n} is out of range: allowed [1, {MAX_N}]", param="n")
    return engine


async def prompt_id_lists(
    engine: EngineClient, prompt: Any, add_special_tokens: bool, param: str = "prompt"
) -> list[list[int]]:
    """The four OpenAI prompt shapes -> one id list per prompt."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts or len(prompts) > MAX_PROMPTS:
        raise bad_request(f"{param} must hold 1 to {MAX_PROMPTS} prompts, got {len(prompts)}", param=param)
    out = []
    for p in prompts:
        if isinstance(p, str):
            ids = await asyncio.to_thread(engine.tokenizer.encode, p, add_special_tokens)
        else:
            ids = list(p)
            check_tokens(engine, ids, param)
        if not ids:
            raise bad_request(f"{param} is empty after tokenization", param=param)
        out.append(ids)
    return out


async def build_jobs(
    state: ServerState, engine: EngineClient, req: SamplingFields, ask: Ask, id_prefix: str, namespace: Hashable = None
) -> list[Job]:
    """n jobs per prompt, choice index = prompt index * n + j; request ids `<base>-<index>`;
    all in the cache `namespace` (see guard.cache_namespace). More than the server's fan-out
    limit of jobs is a 400 naming both numbers."""
    base = new_id(id_prefix)
    num = len(ask.prompts) * req.n
    if num > state.limits.max_fanout:
        raise bad_request(
            f"{len(ask.prompts)} prompts x n={req.n} = {num} sequences, over this "
            f"server's limit of {state.limits.max_fanout} per request (--max-fanout)",
            param="n" if req.n > 1 else "prompt",
            code="fanout_exceeded",
        )
    namespace = await request_adapter(state, engine, req, namespace)
    constraints = await _constraints(state, ask.constraint, num, ask.constraint_param)
    defaults = getattr(engine, "generation_config", None) or {}
    jobs = []
    for p_idx, ids in enumerate(ask.prompts):
        max_tokens = fit_max_tokens(engine, len(ids), ask.max_tokens, ask.max_tokens_param)
        min_tokens = check_min_tokens(req.min_tokens, max_tokens)
        for j in range(req.n):
            params = sampling_params(
                req,
                max_tokens=max_tokens,
                logprobs=ask.logprobs,
                prompt_logprobs=ask.prompt_logprobs,
                seed_offset=j,
                defaults=defaults,
                keep_special_tokens=ask.keep_special_tokens,
            )
            index = p_idx * req.n + j
            constraint = constraints[index]
            banned = sorted(
                set(params.stop_token_ids) | (set() if params.ignore_eos else set(engine.tokenizer.eos_ids))
            )
            if min_tokens and banned:
                constraint = MinTokensConstraint(constraint, banned, engine.vocab_size, min_tokens)
            jobs.append(Job(index, f"{base}-{index}", ids, params, constraint, namespace))
    return jobs


async def _constraints(state: ServerState, build: ConstraintBuilder | None, num: int, param: str) -> list[Any]:
    """`num` fresh constraints (grammar state is per request), compiled off the event loop."""
    if build is None:
        return [None] * num
    factory = await state.constraint_factory()
    try:
        return await asyncio.to_thread(lambda: [build(factory) for _ in range(num)])
    except ValueError as exc:
        raise bad_request(str(exc), param=param) from exc
