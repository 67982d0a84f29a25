"""Bodies of the retrieval APIs: /v1/rerank (Cohere's and Jina's shape, which vLLM and
llama.cpp serve too), /score (vLLM's: `text_1`/`text_2`, or `queries`/`documents`) and
/classify (vLLM's). Requests keep unknown fields for the server's field policy."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentkv.server.schemas import Request


class TextDocument(BaseModel):
    """A document given as an object (Cohere v1, Jina): only its text is ranked; other keys
    (a title, an id) are the client's own and are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    text: str


Document = str | TextDocument


class RerankRequest(Request):
    model: str | None = None
    query: str
    documents: list[Document]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    max_tokens_per_doc: int | None = Field(default=None, ge=1)  # Cohere v2: longer documents are cut
    instruction: str | None = None  # a causal reranker's <Instruct> (Qwen3-Reranker's default otherwise)


class ScoreRequest(Request):
    """One query against many documents (or a list paired one-to-one): `text_1`/`text_2`,
    or newer vLLM's `queries`/`documents`; each side a string or a list of strings."""

    model: str | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    instruction: str | None = None


class ClassifyRequest(Request):
    model: str | None = None
    input: str | list[str]


class RetrievalUsageDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the radix cache served (a causal reranker's shared query)


class RetrievalUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: RetrievalUsageDetails = RetrievalUsageDetails()


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: TextDocument | None = None


class ApiVersion(BaseModel):
    version: str = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class RerankMeta(BaseModel):
    """Cohere's `meta` block, which its client reads."""

    api_version: ApiVersion = ApiVersion()
    billed_units: BilledUnits = BilledUnits()


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RetrievalUsage
    meta: RerankMeta = RerankMeta()


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: RetrievalUsage


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: RetrievalUsage
