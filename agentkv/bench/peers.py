"""The peers every benchmark compares against — llama.cpp (llama-cpp-python) and HF
transformers — driven one way: whether they are installed, loading them on a GGUF, their
prefill and decode timing, and how llama.cpp was built. Peers are imported only here, inside
the function that needs them, so the core never depends on them."""

from __future__ import annotations

import importlib.util
import os
import time
from importlib import metadata
from typing import Any

THREADS = 2  # every engine, ours and the peers, runs this many threads
PEERS = {"llamacpp": "llama_cpp", "transformers": "transformers"}
INSTALL = {
    "llamacpp": "make bench (builds llama-cpp-python for this CPU, ~10 min on 2 cores)",
    "transformers": "pip install '.[test]'",
}


def missing(peer: str) -> str | None:
    """Why `peer` cannot run here (its reason for a skip), or None when it is installed."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {', '.join(PEERS)}")
    if importlib.util.find_spec(PEERS[peer]) is None:
        return f"{PEERS[peer]} is not installed ({INSTALL[peer]})"
    if peer == "llamacpp":  # installed without its dependencies (e.g. diskcache) it cannot import
        try:
            importlib.import_module(PEERS[peer])
        except ImportError as exc:
            return f"{PEERS[peer]} is installed but cannot be imported: {exc} ({INSTALL[peer]})"
    return None


def skipped(reason: str) -> dict[str, str]:
    """The result of an arm that did not run: never counted as a pass."""
    return {"skipped": reason}


def load_llamacpp(model_path: str, n_ctx: int, n_batch: int = 512, logits_all: bool = False):
    """A llama-cpp-python Llama on the GGUF at `model_path`, THREADS threads, quiet.
    `logits_all`: keep every position's logits, which a draft model (prompt lookup) needs:
    without it llama.cpp aborts the process (GGML_ASSERT(logits != nullptr))."""
    from llama_cpp import Llama

    return Llama(
        model_path=model_path,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        n_ctx=n_ctx,
        n_batch=n_batch,
        logits_all=logits_all,
        verbose=False,
    )


def llamacpp_build() -> dict[str, Any]:
    """How the installed llama.cpp was built: its version and its own system info line (the
    SIMD levels compiled in, e.g. AVX512 = 1, AMX_INT8 = 0), or why it is not available."""
    reason = missing("llamacpp")
    if reason:
        return skipped(reason)
    import llama_cpp

    return {
        "version": metadata.version("llama_cpp_python"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }


def load_transformers(model_path: str):
    """HF transformers' causal LM, f32 weights dequantized from the same GGUF, eval mode, with
    generation never stopping early (no EOS: the same greedy choice as ignore_eos)."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    os.environ["HF_HUB_OFFLINE"] = "1"
    path = Path(model_path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def time_llamacpp(llm, ids: list[int], decode_len: int, repeats: int = 1) -> dict[str, float]:
    """Prefill tokens/s (best of `repeats` cold prefills of `ids`) and greedy decode tokens/s
    (`decode_len` tokens after the last prefill)."""
    from agentkv.bench.common import best_of

    llm.eval(ids[:32])  # warm-up: touches the mapped weights
    llm.reset()

    def prefill() -> None:
        llm.reset()
        llm.eval(ids)

    prefill_s = best_of(prefill, repeats)
    t0 = time.perf_counter()
    for _ in range(decode_len):
        llm.eval([llm.sample(temp=0.0)])
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": decode_len / (time.perf_counter() - t0)}


def time_transformers(model, ids: list[int], decode_len: int, repeats: int = 1) -> dict[str, float]:
    """Prefill tokens/s (best of `repeats` forward passes over `ids`) and decode tokens/s
    (`generate` of `decode_len` greedy tokens, less one prefill)."""
    import torch

    from agentkv.bench.common import best_of

    x = torch.tensor([ids])
    with torch.no_grad():
        model(x[:, :32])  # warm-up
        prefill_s = best_of(lambda: model(x), repeats)
        t0 = time.perf_counter()
        out = model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=decode_len, min_new_tokens=decode_len, do_sample=False
        )
        total = time.perf_counter() - t0
    if out.shape[1] - len(ids) != decode_len:
        raise RuntimeError(f"transformers generated {out.shape[1] - len(ids)} tokens, asked for {decode_len}")
    return {"prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": decode_len / max(total - prefill_s, 1e-9)}
