"""llama.cpp's own C++ server, `llama-server`, as a benchmark peer: where its binary is, the
flags it runs with, one launcher (a ServerProcess: 127.0.0.1, its log in a file, /health) and
the facts a result records about it (build flags, system-info line). Used by `agentkv bench
disk` (slot save/restore), `bench long` and `bench agents` (the primary peer).

The fleet flags (`fleet_flags`), and why each is set (checked against the vendored server's
common/arg.cpp, llama-cpp-python 0.3.36):

    -t 2 -tb 2            THREADS, like every engine (its batch default is all cores)
    -np SLOTS             parallel slots: the agents of a turn decode together
    --kv-unified          one KV buffer shared by the slots (-c is the total, not per slot)
    -cram 2048            its prompt cache in RAM (MiB), the size llama_cpp.server's arm gets
    --cache-reuse 256     reuse cached chunks >= 256 tokens by KV shifting
    -c N                  the context: SLOTS x the longest context a run sends
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from agentkv.bench.load_server import ServerProcess
from agentkv.bench.peers import THREADS, skipped

LLAMA_VERSION = "0.3.36"
SLOTS = 5  # parallel slots of the fleet server: the replay's agents
CACHE_RAM_MIB = 2048
CACHE_REUSE = 256
# The CPU features of llama.cpp's build, from its CMake cache (the flags llama_cmake_args.sh chose).
BUILD_KEYS = re.compile(r"^(GGML_[A-Z0-9_]+|CMAKE_BUILD_TYPE|CMAKE_CXX_COMPILER_VERSION):[A-Z]+=(.*)$")


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTKV_CACHE", Path.home() / ".cache" / "agentkv"))


def default_server_binary() -> Path:
    """Where bench/build_llama_server.sh puts the binary."""
    return cache_dir() / f"llama-server-{LLAMA_VERSION}"


def server_missing(binary: Path | None = None) -> str | None:
    """Why llama-server cannot run here (a skip reason), or None."""
    binary = binary or default_server_binary()
    if not os.access(binary, os.X_OK):
        return f"no llama-server at {binary} (bench/build_llama_server.sh builds it)"
    return None


def fleet_flags(n_ctx: int, slots: int = SLOTS) -> list[str]:
    """The flags of the primary peer of `bench long` and `bench agents` (module docstring)."""
    return [
        *("-c", str(n_ctx * slots), "-np", str(slots), "--kv-unified"),
        *("-cram", str(CACHE_RAM_MIB), "--cache-reuse", str(CACHE_REUSE)),
    ]


class LlamaServer(ServerProcess):
    """`llama-server -m GGUF` on 127.0.0.1 with THREADS threads and `flags`; `start()` waits
    for GET /health to answer 200 (it answers 503 while the model loads)."""

    name = "llama-server"

    def __init__(self, binary: Path, gguf: str, flags: list[str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(gguf, flags, log_path=str(log_path))
        self.binary = binary

    @property
    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port), "-t", str(THREADS), "-tb", str(THREADS)]
        # -lv 4: the log then carries its system-info line (startup only; requests log as before)
        return [str(self.binary), "-m", self.model, *where, "-lv", "4", *self.flags]

    def start(self, timeout_s: float = 600.0) -> float:
        try:
            return super().start(timeout_s)
        except RuntimeError as exc:
            tail = Path(self.log_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{exc}\n{tail}") from None

    def post(self, path: str, body: dict) -> dict:
        """POST JSON to the server, its JSON answer."""
        req = urllib.request.Request(
            f"{self.base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=3600) as resp:
            return json.loads(resp.read())

    def complete_ids(self, ids: list[int], slot: int = 0) -> tuple[float, dict]:
        """One greedy token after the prompt `ids` on `slot` (its prompt cache on): (seconds, answer)."""
        body = {"prompt": ids, "n_predict": 1, "cache_prompt": True, "id_slot": slot, "temperature": 0.0}
        t0 = time.perf_counter()
        out = self.post("/completion", body)
        return time.perf_counter() - t0, out


def build_facts(binary: Path | None = None) -> dict[str, Any]:
    """How llama-server was built: its path and its CPU build flags from the CMake cache of the
    build beside it (bench/build_llama_server.sh's folder). Its own system-info line (the SIMD
    levels ggml compiled in) is in each run's log: `system_info`. Skipped when the binary is
    missing."""
    binary = binary or default_server_binary()
    reason = server_missing(binary)
    if reason:
        return skipped(reason)
    out: dict[str, Any] = {"binary": str(binary), "version": LLAMA_VERSION}
    cmake_cache = binary.parent / f"build-llama-server-{LLAMA_VERSION}" / "build" / "CMakeCache.txt"
    if cmake_cache.exists():
        found = (BUILD_KEYS.match(line) for line in cmake_cache.read_text(errors="replace").splitlines())
        out["build_flags"] = {m.group(1): m.group(2) for m in found if m}
    return out


def system_info(log_path: str | Path) -> str | None:
    """The system-info line a llama-server run wrote to its log ("CPU : SSE3 = 1 | AVX = 1 |
    ..."), or None when it wrote none."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if "system_info:" in line:
            return line.split("system_info:", 1)[1].strip()
    return None


def agents_arm(model_path: str, n_ctx: int, log_dir: Path):
    """`bench agents`' llama-server arm (class built here so arms.py stays the peers' index)."""
    from agentkv.bench.arms import Arm, Result

    class LlamaServerArm(Arm):
        """llama-server with the fleet flags: one streamed native /completion per agent with
        token-id prompts, the turn's requests sent at once; cached_len = its `cache_n`."""

        name = "llama-server"
        batched = True
        notes = (
            f"llama-server {LLAMA_VERSION}, -np {SLOTS} --kv-unified -cram {CACHE_RAM_MIB} --cache-reuse {CACHE_REUSE}"
        )

        def __init__(self) -> None:
            reason = server_missing()
            if reason:
                raise RuntimeError(reason)
            log_path = log_dir / f"llama-server-{os.getpid()}.log"
            self.server = LlamaServer(default_server_binary(), model_path, fleet_flags(n_ctx), log_path)
            self.server.start()
            self.notes += f"; {system_info(log_path) or 'no system-info line'}"

        def _one(self, prompt: list[int], max_tokens: int) -> Result:
            body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True}
            body |= {"cache_prompt": True, "stream": True, "return_tokens": True}
            req = urllib.request.Request(
                f"{self.server.base}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            t0, first, tokens, timings = time.perf_counter(), None, [], {}
            with urllib.request.urlopen(req, timeout=3600) as resp:
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("tokens"):
                        first = first or time.perf_counter()
                        tokens += chunk["tokens"]
                    timings = chunk.get("timings") or timings
            done = time.perf_counter()
            return Result(len(prompt), timings.get("cache_n"), tokens, None, t0, first or done, done, len(tokens))

        def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
                return list(pool.map(lambda p: self._one(p, max_tokens), prompts))

        def close(self) -> None:
            self.server.stop()

    return LlamaServerArm()
