"""The retrieval routes: /v1/rerank (also /rerank and /v2/rerank, the paths Jina, vLLM and
Cohere's v2 client use), /score (and /v1/score) and /classify (and /v1/classify). Every
route scores through `scoring`, in the caller's tenant namespace."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request

from agentkv.server.errors import ErrorResponse, bad_request
from agentkv.server.guard import cache_namespace
from agentkv.server.lifecycle import ServerState
from agentkv.server.rerank_schemas import (
    ClassifyData,
    ClassifyRequest,
    ClassifyResponse,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RetrievalUsage,
    RetrievalUsageDetails,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    TextDocument,
)
from agentkv.server.responses import now
from agentkv.server.scoring import Scored, check_count, score_pairs
from agentkv.server.translate import check_fields, check_model, engine_error

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
SCORE_PATHS = ("/score", "/v1/score")
CLASSIFY_PATHS = ("/classify", "/v1/classify")
RERANK_ENDPOINTS = (*RERANK_PATHS, *SCORE_PATHS, *CLASSIFY_PATHS)
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}


def _usage(scored: Scored) -> RetrievalUsage:
    return RetrievalUsage(
        prompt_tokens=scored.prompt_tokens,
        total_tokens=scored.prompt_tokens,
        prompt_tokens_details=RetrievalUsageDetails(cached_tokens=scored.cached_tokens),
    )


async def rerank(state: ServerState, req: RerankRequest, tenant: str | None) -> RerankResponse:
    """Every document scored against the query, best first (ties by index), `top_n` of them."""
    engine = check_model(state, req.model)
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    check_count(len(texts), "documents")
    scored_texts = texts
    if req.max_tokens_per_doc is not None:
        scored_texts = await asyncio.to_thread(_cut, engine.tokenizer, texts, req.max_tokens_per_doc)
    scored = await score_pairs(
        state, engine, [req.query] * len(texts), scored_texts, cache_namespace(tenant, None), req.instruction
    )
    order = sorted(range(len(texts)), key=lambda i: (-scored.scores[i], i))[: req.top_n]
    results = [
        RerankResult(
            index=i,
            relevance_score=scored.scores[i],
            document=TextDocument(text=texts[i]) if req.return_documents else None,
        )
        for i in order
    ]
    rid = f"rerank-{uuid.uuid4().hex}"
    return RerankResponse(id=rid, model=state.model_name, results=results, usage=_usage(scored))


def _cut(tokenizer: Any, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut to its first `max_tokens` tokens (Cohere's `max_tokens_per_doc`)."""
    out = []
    for text in texts:
        ids = tokenizer.encode(text, False)
        out.append(text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]))
    return out


def _score_sides(req: ScoreRequest) -> tuple[list[str], list[str], str]:
    """(queries, documents) paired one-to-one, a single query broadcast over the documents."""
    classic, named = (req.text_1, req.text_2), (req.queries, req.documents)
    if any(v is not None for v in classic) and any(v is not None for v in named):
        raise bad_request("give text_1/text_2 or queries/documents, not both", param="queries")
    classic_given = req.text_1 is not None or req.text_2 is not None
    (left, right), names = (classic, ("text_1", "text_2")) if classic_given else (named, ("queries", "documents"))
    for value, name in zip((left, right), names):
        if value is None:
            raise bad_request(f"{name} is required", param=name)
    left = [left] if isinstance(left, str) else left
    right = [right] if isinstance(right, str) else right
    check_count(len(right), names[1])
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise bad_request(
            f"{names[0]} has {len(left)} texts and {names[1]} {len(right)}: "
            f"give one {names[0]} or as many as {names[1]}",
            param=names[0],
        )
    return left, right, names[1]


async def score(state: ServerState, req: ScoreRequest, tenant: str | None) -> ScoreResponse:
    engine = check_model(state, req.model)
    queries, documents, _ = _score_sides(req)
    scored = await score_pairs(state, engine, queries, documents, cache_namespace(tenant, None), req.instruction)
    return ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        created=now(),
        model=state.model_name,
        data=[ScoreData(index=i, score=s) for i, s in enumerate(scored.scores)],
        usage=_usage(scored),
    )


async def classify(state: ServerState, req: ClassifyRequest) -> ClassifyResponse:
    """Each input's label probabilities: softmax over the labels (sigmoid for a single one)."""
    engine = check_model(state, req.model)
    traits = engine.traits
    if not traits.num_labels:
        raise bad_request(f"The model {state.model_name!r} has no classification head", param="model")
    texts = [req.input] if isinstance(req.input, str) else req.input
    check_count(len(texts), "input")
    encode = engine.tokenizer.encode
    ids = await asyncio.to_thread(lambda: [encode(t, True) for t in texts])
    try:
        logits = np.asarray(await engine.classify(ids), dtype=np.float64)
    except ValueError as exc:
        raise engine_error(exc) from exc
    if traits.num_labels == 1:
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = e / e.sum(axis=1, keepdims=True)
    names = traits.label_names if len(traits.label_names) == traits.num_labels else ()
    data = [
        ClassifyData(
            index=i, label=names[k] if names else f"LABEL_{k}", probs=row.tolist(), num_classes=traits.num_labels
        )
        for i, (row, k) in enumerate(zip(probs, probs.argmax(axis=1)))
    ]
    num = sum(map(len, ids))
    return ClassifyResponse(
        id=f"classify-{uuid.uuid4().hex}",
        created=now(),
        model=state.model_name,
        data=data,
        usage=_usage(Scored([], num)),
    )


def add_rerank_routes(app: FastAPI, state: ServerState, auth: list[Any]) -> None:
    async def rerank_route(req: RerankRequest, request: Request) -> Any:
        check_fields(state, req, request.url.path)
        return await rerank(state, req, request.state.tenant)

    async def score_route(req: ScoreRequest, request: Request) -> Any:
        check_fields(state, req, request.url.path)
        return await score(state, req, request.state.tenant)

    async def classify_route(req: ClassifyRequest, request: Request) -> Any:
        check_fields(state, req, request.url.path)
        return await classify(state, req)

    for paths, handler, model in (
        (RERANK_PATHS, rerank_route, RerankResponse),
        (SCORE_PATHS, score_route, ScoreResponse),
        (CLASSIFY_PATHS, classify_route, ClassifyResponse),
    ):
        for i, path in enumerate(paths):  # the aliases stay out of /openapi.json: one operation per API
            route = app.post(
                path,
                response_model=model,
                response_model_exclude_none=True,
                responses=_ERRORS,
                dependencies=auth,
                include_in_schema=i == 0,
            )
            route(handler)
