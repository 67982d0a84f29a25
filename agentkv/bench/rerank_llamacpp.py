"""The llama.cpp arm of `agentkv bench rerank`: llama.cpp's own server (`llama-server
--reranking`, built by bench/build_llama_server.sh into ~/.cache/agentkv) on the same rank
GGUF, THREADS threads, every document one of its parallel slots' sequences. Its /v1/rerank
takes text, so the prompts go as the text of their ids (rerank_gguf.py: one character per
piece); the server's own /tokenize is asked to confirm it reads back exactly those ids. It
prefills every pair whole: llama.cpp reuses no prefix across rerank tasks."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from agentkv.bench.llama_server import LlamaServer, default_server_binary
from agentkv.bench.peers import skipped
from agentkv.bench.rerank_gguf import text_of

SLOTS = 16  # parallel sequences: llama.cpp batches this many pairs per step at most


def llamacpp_arm(
    path: Path, batch: list[list[int]], cut: tuple[int, int], work: Path, binary: str | None = None
) -> tuple[dict, np.ndarray | None]:
    """(figures, scores in document order) of llama-server ranking `batch`, or (skipped/error,
    None). `cut`: (prefix length, suffix length) -- the query and the template's tail."""
    server = Path(binary) if binary else default_server_binary()
    if not server.exists():
        return skipped(f"no llama-server at {server} (bench/build_llama_server.sh builds it)"), None
    work.mkdir(parents=True, exist_ok=True)
    slots = min(SLOTS, len(batch))
    flags = ["--reranking", "-np", str(slots), "-b", "2048", "-ub", "512"]
    n_ctx = slots * (max(map(len, batch)) + 16)
    live = LlamaServer(server, str(path), ["-c", str(n_ctx), *flags], work / "llama-server-rerank.log")
    try:
        live.start(600)
    except (OSError, RuntimeError, ValueError) as exc:
        live.stop()
        return {"error": f"llama-server {server}: {exc}"}, None
    try:
        query = text_of(batch[0][: cut[0]])
        documents = [text_of(ids[cut[0] : len(ids) - cut[1]]) for ids in batch]
        read_back = live.post("/tokenize", {"content": text_of(batch[0])})["tokens"]
        live.post("/v1/rerank", {"query": query, "documents": documents[:2]})  # warm-up, untimed
        start = time.perf_counter()
        out = live.post("/v1/rerank", {"query": query, "documents": documents, "top_n": len(documents)})
        wall = time.perf_counter() - start
    finally:
        live.stop()
    scores = np.zeros(len(batch), dtype=np.float64)
    for result in out["results"]:
        scores[result["index"]] = result["relevance_score"]
    figures = {
        "wall_s": wall,
        "docs_per_s": len(batch) / wall,
        "computed_tokens": sum(map(len, batch)),
        "cached_tokens": 0,
        "parallel_slots": slots,
        "prompt_ids_read_back_exactly": read_back == batch[0],
    }
    return figures, scores
