"""The engines a workload is run on ("arms"), all driven the same way: one call per turn with
every agent's prompt (token ids) and the answer length; greedy, EOS ignored.

Peers are imported inside the arm that needs them, so the core never depends on them.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, NamedTuple

from agentkv.bench import peers
from agentkv.bench.engine import build_engine
from agentkv.commands.ports import free_port

THREADS = peers.THREADS


class Result(NamedTuple):
    """One request: `cached_len` is the prompt prefix the arm reused (None: unknown);
    `token_ids` None when the arm only returns text (HTTP). Times are perf_counter seconds."""

    prompt_len: int
    cached_len: int | None
    token_ids: list[int] | None
    text: str | None
    t_submit: float
    t_first: float
    t_done: float
    num_generated: int = 0


class Arm:
    name = "arm"
    batched = False  # the agents of one turn run concurrently
    notes = ""

    def warm_up(self, vocab_ids: list[int]) -> None:
        """Run a short unrelated request so kernels and allocators are ready (not timed)."""
        self.run_turn([vocab_ids], 2)

    def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
        raise NotImplementedError

    def counters(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class AgentkvArm(Arm):
    """agentkv in-process: the agents of a turn are submitted together and batched."""

    batched = True

    def __init__(self, model: str, prefix_cache: bool, kv_blocks: int, weights: str = "resident"):
        import torch

        torch.set_num_threads(THREADS)
        self.name = "agentkv" if prefix_cache else "agentkv-nocache"
        self.notes = (
            f"in-process Engine ({weights} weights), turn submitted as one batch, "
            f"prefix cache {'on' if prefix_cache else 'off'}"
        )
        flags = SimpleNamespace(model=model, weights=weights)
        self.engine = build_engine(flags, prefix_cache=prefix_cache, num_blocks=kv_blocks)
        self._n = 0
        self._base = None

    def warm_up(self, vocab_ids: list[int]) -> None:
        super().warm_up(vocab_ids)
        self.engine.free_cache()
        self._base = self.engine.stats()

    def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
        from agentkv.runtime.params import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        rids, t0 = [], time.perf_counter()
        for p in prompts:
            rid = f"r{self._n}"
            self._n += 1
            self.engine.add_request(rid, p, params)
            rids.append(rid)
        first: dict[str, float] = {}
        merged: dict[str, Any] = {}
        final: dict[str, tuple[Any, float]] = {}
        while len(final) < len(rids):
            for out in self.engine.step():
                now = time.perf_counter()
                first.setdefault(out.request_id, now)
                if out.request_id in merged:
                    merged[out.request_id].merge(out)
                else:
                    merged[out.request_id] = out
                if out.finished:
                    final[out.request_id] = (merged[out.request_id], now)
        return [
            Result(
                len(p),
                final[r][0].cached_len,
                list(final[r][0].token_ids),
                final[r][0].text,
                t0,
                first[r],
                final[r][1],
                len(final[r][0].token_ids),
            )
            for p, r in zip(prompts, rids)
        ]

    def counters(self) -> dict[str, Any]:
        now, base = self.engine.stats(), self._base
        keys = (
            "prefix_queried_tokens",
            "prefix_hit_tokens",
            "computed_tokens",
            "prompt_tokens",
            "generation_tokens",
            "preemptions",
            "evicted_blocks",
        )
        return {k: getattr(now, k) - (getattr(base, k) if base else 0) for k in keys}


class HttpArm(Arm):
    """`agentkv serve` as a subprocess on 127.0.0.1; streamed /v1/completions with token-id
    prompts, one HTTP request per agent, the turn's requests sent concurrently."""

    name = "agentkv-http"
    batched = True
    notes = "agentkv serve subprocess, /v1/completions (token-id prompt, stream) in parallel threads"

    def __init__(self, model: str, kv_blocks: int, weights: str = "resident", startup_s: float = 180.0):
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "agentkv.cli",
            "serve",
            model,
            "--port",
            str(self.port),
            "--kv-cache-blocks",
            str(kv_blocks),
            "--log-level",
            "warning",
        ]
        if weights != "resident":
            raise ValueError("agentkv serve has no --weights flag yet: the HTTP arm runs resident weights")
        env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        self.model = model
        deadline = time.monotonic() + startup_s
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"agentkv serve did not become healthy: {cmd}")
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def _one(self, prompt: list[int], max_tokens: int) -> Result:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        first, text, cached, generated = None, [], None, 0
        with urllib.request.urlopen(req, timeout=3600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices"):
                    first = first or time.perf_counter()
                    text.append(chunk["choices"][0].get("text", ""))
                usage = chunk.get("usage")
                if usage:
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    generated = usage.get("completion_tokens", 0)
        done = time.perf_counter()
        return Result(len(prompt), cached, None, "".join(text), t0, first or done, done, generated)

    def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            return list(pool.map(lambda p: self._one(p, max_tokens), prompts))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LlamaCppArm(Arm):
    """llama.cpp through llama-cpp-python with its prompt cache (`LlamaRAMCache`), used as
    `create_completion` uses it: load the cached state with the longest common prefix when it
    beats the live context, then `generate` (which reuses the live context's common prefix),
    then save the state under prompt + completion. One context: agents run one after another."""

    name = "llamacpp"
    notes = "llama-cpp-python, LlamaRAMCache (2 GiB), sequential agents, n_batch 512, 2 threads"

    def __init__(self, model_path: str, n_ctx: int):
        from llama_cpp import LlamaRAMCache

        self.llm = peers.load_llamacpp(model_path, n_ctx)
        self.cache = LlamaRAMCache(capacity_bytes=2 << 30)

    def warm_up(self, vocab_ids: list[int]) -> None:
        self.run_turn([vocab_ids], 2)
        self.llm.reset()
        self.cache.cache_state.clear()

    def _reused(self, prompt: list[int]) -> int:
        """The prefix `generate` will keep: the live context's common prefix with the prompt,
        one less when it is the whole prompt (its last token is re-run for logits)."""
        live = self.llm._input_ids[: self.llm.n_tokens].tolist()
        n = self.llm.longest_token_prefix(live, prompt)
        return n - 1 if n == len(prompt) else n

    def _one(self, prompt: list[int], max_tokens: int) -> Result:
        t0 = time.perf_counter()
        try:
            state = self.cache[prompt]
            live = self.llm._input_ids[: self.llm.n_tokens].tolist()
            if self.llm.longest_token_prefix(state.input_ids.tolist(), prompt) > self.llm.longest_token_prefix(
                live, prompt
            ):
                self.llm.load_state(state)
        except KeyError:
            pass
        cached = self._reused(prompt)
        out: list[int] = []
        first = None
        for tok in self.llm.generate(prompt, temp=0.0, reset=True):
            first = first or time.perf_counter()
            out.append(int(tok))
            if len(out) == max_tokens:
                break
        self.cache[prompt + out] = self.llm.save_state()
        return Result(len(prompt), cached, out, None, t0, first, time.perf_counter(), len(out))

    def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
        return [self._one(p, max_tokens) for p in prompts]


class TransformersArm(Arm):
    """HF transformers, f32 weights dequantized from the same GGUF; `generate` per request
    with its own KV cache, so every turn re-prefills the whole context. Sequential."""

    name = "transformers"
    notes = "transformers f32 (from the GGUF), generate() per request, no reuse across calls"

    def __init__(self, model_path: str):
        import torch

        self.torch = torch
        self.model = peers.load_transformers(model_path)

    def _one(self, prompt: list[int], max_tokens: int) -> Result:
        from transformers.generation.streamers import BaseStreamer

        times: list[float] = []

        class _Clock(BaseStreamer):
            def put(self, value):
                times.append(time.perf_counter())

            def end(self):
                pass

        t0 = time.perf_counter()
        with self.torch.no_grad():
            x = self.torch.tensor([prompt])
            # An explicit mask: otherwise a prompt token equal to pad_token_id would be masked.
            ids = self.model.generate(
                x, attention_mask=self.torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False, streamer=_Clock()
            )
        done = time.perf_counter()
        out = ids[0, len(prompt) :].tolist()
        first = times[1] if len(times) > 1 else done  # put #0 is the prompt itself
        return Result(len(prompt), 0, out, None, t0, first, done, len(out))

    def run_turn(self, prompts: list[list[int]], max_tokens: int) -> list[Result]:
        return [self._one(p, max_tokens) for p in prompts]


ARMS = ("agentkv", "agentkv-nocache", "agentkv-http", "llama-server", "llamacpp", "transformers")


def make_arm(name: str, model: str, kv_blocks: int, n_ctx: int, weights: str = "resident") -> Arm:
    """Build the named arm (imports its peer library only now)."""
    from agentkv.formats.resolve import resolve_model_path

    if name in ("agentkv", "agentkv-nocache"):
        return AgentkvArm(model, name == "agentkv", kv_blocks, weights)
    if name == "agentkv-http":
        return HttpArm(model, kv_blocks, weights)
    if name == "llama-server":
        from pathlib import Path

        from agentkv.bench.llama_server import agents_arm

        return agents_arm(str(resolve_model_path(model)), n_ctx, Path(os.environ.get("TMPDIR", "/tmp")))
    if name == "llamacpp":
        return LlamaCppArm(str(resolve_model_path(model)), n_ctx)
    if name == "transformers":
        return TransformersArm(str(resolve_model_path(model)))
    raise ValueError(f"unknown arm {name!r}; choose from {', '.join(ARMS)}")
