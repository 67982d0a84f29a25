"""The small endpoints: /v1/models, /v1/embeddings, /tokenize, /detokenize."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from agentkv.server.chat import render_chat
from agentkv.server.errors import bad_request
from agentkv.server.lifecycle import ServerState
from agentkv.server.prologue import prompt_id_lists
from agentkv.server.responses import (
    DetokenizeResponse,
    EmbeddingData,
    EmbeddingResponse,
    EmbeddingUsage,
    ModelCard,
    ModelList,
    TokenizeResponse,
    now,
)
from agentkv.server.schemas import DetokenizeRequest, EmbeddingRequest, TokenizeRequest
from agentkv.server.serving_lora import lora_cards
from agentkv.server.translate import check_model, check_tokens, engine_error

_CREATED = now()


def list_models(state: ServerState) -> ModelList:
    engine = state.require_engine()
    adapters = [ModelCard(**card) for card in lora_cards(engine, state.model_name, _CREATED)]
    return ModelList(
        data=[ModelCard(id=state.model_name, created=_CREATED, max_model_len=engine.max_model_len), *adapters]
    )


async def create_embeddings(state: ServerState, req: EmbeddingRequest) -> EmbeddingResponse:
    engine = check_model(state, req.model)
    if not engine.is_embedding:
        raise bad_request(
            f"The model {state.model_name!r} does not produce embeddings; "
            f"serve an embedding model (e.g. minilm) for /v1/embeddings",
            param="model",
        )
    batch = await prompt_id_lists(engine, req.input, True, param="input")
    for ids in batch:
        if len(ids) > engine.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {engine.max_model_len} tokens, "
                f"but an input has {len(ids)} tokens",
                param="input",
                code="context_length_exceeded",
            )
    try:
        vectors = await engine.embed(batch)
    except ValueError as exc:
        raise engine_error(exc) from exc
    if req.dimensions is not None and vectors and req.dimensions != len(vectors[0]):
        vectors = _truncate(engine.traits.matryoshka, vectors, req.dimensions)
    data = []
    for i, vec in enumerate(vectors):
        value: Any = vec
        if req.encoding_format == "base64":
            value = base64.b64encode(np.asarray(vec, dtype=np.float32).tobytes()).decode()
        data.append(EmbeddingData(index=i, embedding=value))
    num = sum(len(ids) for ids in batch)
    return EmbeddingResponse(
        data=data, model=state.model_name, usage=EmbeddingUsage(prompt_tokens=num, total_tokens=num)
    )


def _truncate(matryoshka: bool, vectors: list[list[float]], dimensions: int) -> list[list[float]]:
    """A Matryoshka model's embeddings cut to their first `dimensions` and renormalised (as
    OpenAI's `dimensions` does); any other model's only at their own size."""
    native = len(vectors[0])
    if not matryoshka or not 0 < dimensions <= native:
        allowed = f"1..{native} (Matryoshka embeddings)" if matryoshka else f"only {native}"
        raise bad_request(
            f"dimensions={dimensions} is not supported: this model's embeddings have {native} dimensions "
            f"(allowed: {allowed})",
            param="dimensions",
        )
    cut = np.asarray(vectors, dtype=np.float32)[:, :dimensions]
    norms = np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), np.float32(1e-12))
    return (cut / norms).astype(np.float32).tolist()


async def tokenize(state: ServerState, req: TokenizeRequest) -> TokenizeResponse:
    engine = check_model(state, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("give exactly one of prompt or messages", param="prompt")
    if req.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []] or None
        text = render_chat(
            state.chat_template(), req.messages, tools=tools, add_generation_prompt=req.add_generation_prompt
        )
        add_special = False
    else:
        text, add_special = req.prompt, req.add_special_tokens
    ids = await asyncio.to_thread(engine.tokenizer.encode, text, add_special)
    return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=engine.max_model_len)


async def detokenize(state: ServerState, req: DetokenizeRequest) -> DetokenizeResponse:
    engine = check_model(state, req.model)
    check_tokens(engine, req.tokens, "tokens")
    return DetokenizeResponse(prompt=engine.tokenizer.decode(req.tokens))
