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

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from agentkv.bench.isolate import failed, run_isolated
from agentkv.bench.peers import THREADS, missing, skipped
from agentkv.commands.cluster import ClusterError, wait_healthy

LLAMA_VERSION = "0.3.36"
SLOT_FILE = "agent-prefix.bin"


def default_server_binary() -> Path:
    cache = Path(os.environ.get("AGENTKV_CACHE", Path.home() / ".cache" / "agentkv"))
    return cache / f"llama-server-{LLAMA_VERSION}"


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
class _Server:
    """llama-server on 127.0.0.1 with --slot-save-path, THREADS threads, one slot."""

    def __init__(
        self, binary: Path, gguf: str, slots: Path, n_ctx: int, timeout_s: float, extra: list[str] | None = None
    ) -> None:
        """`extra`: the server's mode flags instead of one slot saved under `slots` (the
        folder its log goes to either way)."""
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(THREADS)]
        cmd += ["-tb", str(THREADS), "-c", str(n_ctx)]
        cmd += ["-np", "1", "--slot-save-path", str(slots)] if extra is None else extra
        # Its log goes to a file beside the slots: an undrained pipe would stall the server
        # once its per-request logging filled the pipe's buffer.
        self.log_path = slots / f"llama-server-{self.port}.log"
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True)
        try:
            wait_healthy(f"http://127.0.0.1:{self.port}", self.proc, time.monotonic() + timeout_s, what="llama-server")
        except ClusterError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {self.log_path.read_text(errors='replace')[-2000:]}") from None

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=3600) as resp:
            return json.loads(resp.read())

    def warm_up(self, ids: list[int]) -> None:
        """One short request first, as the agentkv arms make (page-in, first-call setup)."""
        self.complete(ids)

    def complete(self, ids: list[int]) -> tuple[float, dict]:
        body = {"prompt": ids, "n_predict": 1, "cache_prompt": True, "id_slot": 0, "temperature": 0.0}
        t0 = time.perf_counter()
        out = self.post("/completion", body)
        return time.perf_counter() - t0, out

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def server_arm(spec: dict, binary: Path, slots: Path, timeout_s: float) -> dict:
    gguf, ids = _gguf_and_ids(spec)
    slots.mkdir(parents=True, exist_ok=True)
    (slots / SLOT_FILE).unlink(missing_ok=True)
    n_ctx = len(ids) + 64
    first = _Server(binary, gguf, slots, n_ctx, timeout_s)
    warm_up_ids = ids[:1] + [(t + 1) % spec["vocab"] for t in ids[1:8]]  # shares one token at most
    try:
        first.warm_up(warm_up_ids)
        cold_s, cold = first.complete(ids)
        saved = first.post("/slots/0?action=save", {"filename": SLOT_FILE})
    finally:
        first.stop()
    second = _Server(binary, gguf, slots, n_ctx, timeout_s)
    try:
        second.warm_up(warm_up_ids)
        t0 = time.perf_counter()
        restored = second.post("/slots/0?action=restore", {"filename": SLOT_FILE})
        restore_s = time.perf_counter() - t0
        answer_s, warm = second.complete(ids)
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
