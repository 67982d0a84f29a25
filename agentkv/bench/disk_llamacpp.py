"""The llama.cpp arm of `agentkv bench disk`: TTFT of an agent prefix restored after a restart.

Preferred: llama.cpp's own server (`bench/build_llama_server.sh` builds it from llama-cpp-python's
vendored llama.cpp into ~/.cache/agentkv/llama-server-<version>), started with --slot-save-path:

    server 1: POST /completion (prefix, 1 token; cold TTFT)  POST /slots/0?action=save
    server 2: POST /slots/0?action=restore, then POST /completion (restored TTFT = both)

Fallback, without that binary: llama-cpp-python's llama_state_seq_save_file /
llama_state_seq_load_file (the calls behind slot save/restore), each phase in its own process;
the restored TTFT is the load plus evaluating the last prompt token (the server re-evaluates it
too, for its logits). The result's "how" says which ran. Peers are imported only here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentkv.bench.isolate import failed, run_isolated
from agentkv.bench.llama_server import LlamaServer, default_server_binary
from agentkv.bench.peers import THREADS, missing, skipped

SLOT_FILE = "agent-prefix.bin"


def _gguf_and_ids(spec: dict) -> tuple[str, list[int]]:
    """The GGUF path of `spec["model"]` and the prefix's ids: the agentkv arms' ids, over the
    vocabulary size the cold arm reported (`spec["vocab"]`)."""
    from agentkv.bench.workloads import lcg
    from agentkv.formats.resolve import resolve_model_path

    path = resolve_model_path(spec["model"])
    if path.suffix != ".gguf":
        raise ValueError(f"model {spec['model']!r} is not a GGUF file ({path}); llama.cpp needs one")
    return str(path), lcg(spec["prefix_len"], spec["seed"], spec["vocab"])


def llamacpp_arm(spec: dict, binary: str | None, work: Path, timeout_s: float) -> dict:
    """llama-server's slot save/restore when the binary exists, else llama-cpp-python's state
    files, else skipped (never a pass)."""
    server = Path(binary) if binary else default_server_binary()
    if server.exists():
        try:
            return server_arm(spec, server, work / "llama-slots", timeout_s)
        except (OSError, RuntimeError, ValueError) as exc:
            return {"error": f"llama-server {server}: {exc}"}
    reason = missing("llamacpp")
    if reason:
        return skipped(f"no llama-server at {server} (bench/build_llama_server.sh builds it) and {reason}")
    state = {**spec, "state_file": str(work / "llama-state" / SLOT_FILE)}
    Path(state["state_file"]).parent.mkdir(parents=True, exist_ok=True)
    saved = run_isolated("agentkv.bench.disk_llamacpp:python_save", state, work, "llama-save", timeout_s)
    if failed(saved):
        return saved
    restored = run_isolated("agentkv.bench.disk_llamacpp:python_restore", state, work, "llama-restore", timeout_s)
    if failed(restored):
        return restored
    return {
        "how": "llama-cpp-python state files",
        "note": "llama-server was not built here; llama_state_seq_save_file / llama_state_seq_load_file "
        "(what its slot save/restore calls), each phase a fresh process",
        "cold_ttft_s": saved["ttft_s"],
        "warm_ttft_s": restored["ttft_s"],
        "restored_tokens": restored["restored_tokens"],
        "state_bytes": saved["state_bytes"],
        "same_first_token": saved["token"] == restored["token"],
    }


# -- llama-server ---------------------------------------------------------------------------
def _server(binary: Path, gguf: str, slots: Path, n_ctx: int, timeout_s: float) -> LlamaServer:
    """llama-server with --slot-save-path, one slot, started and healthy. Its log goes to a
    file beside the slots (an undrained pipe would stall it)."""
    flags = ["-c", str(n_ctx), "-np", "1", "--slot-save-path", str(slots)]
    server = LlamaServer(binary, gguf, flags, slots / f"llama-server-{os.getpid()}.log")
    server.start(timeout_s)
    return server


def server_arm(spec: dict, binary: Path, slots: Path, timeout_s: float) -> dict:
    gguf, ids = _gguf_and_ids(spec)
    slots.mkdir(parents=True, exist_ok=True)
    (slots / SLOT_FILE).unlink(missing_ok=True)
    n_ctx = len(ids) + 64
    first = _server(binary, gguf, slots, n_ctx, timeout_s)
    warm_up_ids = ids[:1] + [(t + 1) % spec["vocab"] for t in ids[1:8]]  # shares one token at most
    try:
        first.complete_ids(warm_up_ids)  # as the agentkv arms warm up (page-in, first-call setup)
        cold_s, cold = first.complete_ids(ids)
        saved = first.post("/slots/0?action=save", {"filename": SLOT_FILE})
    finally:
        first.stop()
    second = _server(binary, gguf, slots, n_ctx, timeout_s)
    try:
        second.complete_ids(warm_up_ids)
        t0 = time.perf_counter()
        restored = second.post("/slots/0?action=restore", {"filename": SLOT_FILE})
        restore_s = time.perf_counter() - t0
        answer_s, warm = second.complete_ids(ids)
    finally:
        second.stop()
    return {
        "how": "llama-server slot restore",
        "note": f"{binary.name} --slot-save-path, POST /slots/0?action=save|restore, -t {THREADS}, one slot",
        "cold_ttft_s": cold_s,
        "warm_ttft_s": restore_s + answer_s,
        "restore_s": restore_s,
        "restored_tokens": restored.get("n_restored"),
        "state_bytes": saved.get("n_written"),
        "warm_prompt_evaluated": (warm.get("timings") or {}).get("prompt_n"),
        "same_first_token": cold.get("content") == warm.get("content"),
    }


# -- llama-cpp-python state files (each phase runs isolated) ---------------------------------
def _warm_up(llm, ids: list[int], vocab: int) -> None:
    """One short evaluation first, as the other arms make; the next eval starts over."""
    llm.eval([(t + 1) % vocab for t in ids[:8]])
    llm.reset()


def python_save(spec: dict) -> dict:
    """Cold: compute the prefix, sample one token, save sequence 0 with its tokens."""
    import llama_cpp

    from agentkv.bench.peers import load_llamacpp

    gguf, ids = _gguf_and_ids(spec)
    llm = load_llamacpp(gguf, n_ctx=len(ids) + 64)
    _warm_up(llm, ids, spec["vocab"])
    t0 = time.perf_counter()
    llm.eval(ids)
    token = llm.sample(temp=0.0)
    ttft = time.perf_counter() - t0
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    written = llama_cpp.llama_state_seq_save_file(llm._ctx.ctx, spec["state_file"].encode(), 0, tokens, len(ids))
    if written == 0:
        raise RuntimeError("llama_state_seq_save_file wrote nothing")
    return {"ttft_s": ttft, "token": int(token), "state_bytes": int(written)}


def python_restore(spec: dict) -> dict:
    """Restored: load sequence 0, then evaluate the last prompt token for its logits."""
    import ctypes

    import llama_cpp

    from agentkv.bench.peers import load_llamacpp

    gguf, ids = _gguf_and_ids(spec)
    llm = load_llamacpp(gguf, n_ctx=len(ids) + 64)
    _warm_up(llm, ids, spec["vocab"])
    out = (llama_cpp.llama_token * len(ids))()
    count = ctypes.c_size_t(0)
    t0 = time.perf_counter()
    read = llama_cpp.llama_state_seq_load_file(
        llm._ctx.ctx, spec["state_file"].encode(), 0, out, len(ids), ctypes.byref(count)
    )
    if read == 0 or list(out[: count.value]) != ids:
        raise RuntimeError(f"llama_state_seq_load_file restored {count.value} tokens ({read} bytes), not the prefix")
    llm.n_tokens = len(ids) - 1  # keep positions < n-1; eval drops the rest and recomputes the last
    llm.input_ids[: len(ids) - 1] = ids[:-1]
    llm.eval(ids[-1:])
    token = llm.sample(temp=0.0)
    return {"ttft_s": time.perf_counter() - t0, "token": int(token), "restored_tokens": int(count.value)}
