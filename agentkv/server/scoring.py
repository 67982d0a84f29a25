"""Scoring (query, document) pairs with whatever the server hosts, for /rerank and /score:

- a cross-encoder (a classification head with one label): each pair as its tokenizer joins
  it, all pairs in one padding-free encoder call; score = sigmoid(logit);
- a causal LM (Qwen3-Reranker): each pair as one engine request in the request's cache
  namespace, so the instruction + query they share is prefilled once and the rest hit the
  radix cache; score = sigmoid(logit(yes) - logit(no)) at the last position;
- a bi-encoder (an embedding model): cosine of the two L2-normalised embeddings.
Handlers never touch tensors: the engine returns numbers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Hashable
from typing import NamedTuple

import numpy as np

from agentkv.runtime.client import EngineClient
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.rerank import judge_ids, judge_score, pair_prompt, sigmoid
from agentkv.server.errors import APIError, bad_request
from agentkv.server.generation import ChoiceStreams, Job, collect
from agentkv.server.lifecycle import ServerState
from agentkv.server.translate import engine_error

MAX_DOCUMENTS = 1000  # Cohere's own limit per rerank call


class Scored(NamedTuple):
    scores: list[float]
    prompt_tokens: int
    cached_tokens: int = 0


def check_count(num_documents: int, param: str) -> None:
    if num_documents == 0:
        raise bad_request(f"{param} must hold at least one document, got an empty list", param=param)
    if num_documents > MAX_DOCUMENTS:
        raise bad_request(f"{param} holds {num_documents} documents; at most {MAX_DOCUMENTS} per request", param=param)


def _check_lengths(engine: EngineClient, lengths: list[int], param: str, limit: int | None = None) -> None:
    limit = engine.max_model_len if limit is None else limit
    for i, n in enumerate(lengths):
        if n > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens, but pair {i} (query and "
                f"document together) has {n} tokens",
                param=param,
                code="context_length_exceeded",
            )


async def score_pairs(
    state: ServerState,
    engine: EngineClient,
    queries: list[str],
    documents: list[str],
    namespace: Hashable = None,
    instruction: str | None = None,
) -> Scored:
    """`queries[i]` against `documents[i]` for every i (equal lengths), by the hosted model's kind."""
    if engine.traits.num_labels:
        return await _cross_encode(engine, queries, documents)
    if engine.is_embedding:
        return await _bi_encode(engine, queries, documents)
    return await _judge(state, engine, queries, documents, namespace, instruction)


async def _cross_encode(engine: EngineClient, queries: list[str], documents: list[str]) -> Scored:
    if engine.traits.num_labels != 1:
        raise bad_request(
            f"this model classifies into {engine.traits.num_labels} labels; scoring pairs needs a "
            f"one-label cross-encoder (use /classify)",
            param="model",
        )
    encode = engine.tokenizer.encode_pair
    pairs = await asyncio.to_thread(lambda: [encode(q, d) for q, d in zip(queries, documents)])
    _check_lengths(engine, [len(ids) for ids, _ in pairs], "documents")
    try:
        logits = await engine.classify([ids for ids, _ in pairs], [types for _, types in pairs])
    except ValueError as exc:
        raise engine_error(exc) from exc
    return Scored([sigmoid(row[0]) for row in logits], sum(len(ids) for ids, _ in pairs))


async def _bi_encode(engine: EngineClient, queries: list[str], documents: list[str]) -> Scored:
    texts = list(dict.fromkeys([*queries, *documents]))  # each distinct text embedded once
    encode = engine.tokenizer.encode
    ids = await asyncio.to_thread(lambda: [encode(t, True) for t in texts])
    _check_lengths(engine, [len(x) for x in ids], "documents")
    try:
        vectors = dict(zip(texts, np.asarray(await engine.embed(ids), dtype=np.float64)))
    except ValueError as exc:
        raise engine_error(exc) from exc
    scores = [float(vectors[q] @ vectors[d]) for q, d in zip(queries, documents)]
    return Scored(scores, sum(len(x) for x in ids))


async def _judge(
    state: ServerState,
    engine: EngineClient,
    queries: list[str],
    documents: list[str],
    namespace: Hashable,
    instruction: str | None,
) -> Scored:
    """One max_tokens=1 greedy request per pair, all admitted at once: the scheduler lets the
    others wait for the first one's prefill of the shared prefix, then they hit it."""
    try:
        yes, no = judge_ids(engine.tokenizer)
    except ValueError as exc:
        raise bad_request(str(exc), param="model") from exc
    if len(documents) > state.limits.max_fanout:
        raise bad_request(
            f"{len(documents)} documents: a causal reranker runs one sequence per document, and this "
            f"server takes at most {state.limits.max_fanout} per request (serve --max-fanout)",
            param="documents",
        )
    tok = engine.tokenizer
    prompts = await asyncio.to_thread(lambda: [pair_prompt(tok, q, d, instruction) for q, d in zip(queries, documents)])
    _check_lengths(engine, [len(p) for p in prompts], "documents", engine.max_model_len - 1)
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logit_token_ids=(yes, no), speculative=False)
    base = f"rerank-{uuid.uuid4().hex}"
    jobs = [Job(i, f"{base}-{i}", ids, params, None, namespace) for i, ids in enumerate(prompts)]
    async with ChoiceStreams(state, engine, jobs) as streams:
        last = await collect(streams)
    scores = []
    for i in range(len(jobs)):
        logprobs = last[i].logprobs
        if not logprobs or len(logprobs[0].logits) != 2:
            raise APIError(500, f"pair {i} finished without its yes/no logits (a bug)", type="internal_server_error")
        scores.append(judge_score(*logprobs[0].logits))
    return Scored(scores, sum(map(len, prompts)), sum(out.cached_len for out in last.values()))
