"""The agent replay of `agentkv bench hybrid`: AGENTS agents x TURNS turns over a PREFIX-token
shared prefix (a system prompt and tool table), turn-major (every agent's turn t before any
agent's turn t + 1). Each agent starts with its own FIRST-token message; each turn is answered
greedily with REPLY tokens and the next turn sends the whole transcript back with a
TOOL_RESULT-token tool answer appended. Token ids throughout (`/completion` on llama-server),
so both engines see the same prompts.

Arms: agentkv (its prefix cache and recurrent-state snapshots) and llama-server (`fleet_flags`:
AGENTS slots, unified KV, its prompt cache; agent a pinned to slot a, the best case for its
per-slot state) on the hybrid GGUF, and the same two on a dense GGUF of a similar size (Qwen3-0.6B
shapes). Each reports the prompt tokens sent, those computed (agentkv: prompt minus cached;
llama-server: its `prompt_n`), the hit rate and the wall time."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from agentkv.bench import peers
from agentkv.bench.common import log, prompt_ids

REPLAY = {"agents": 5, "turns": 10, "prefix": 2048, "first": 32, "reply": 32, "tool_result": 64}


def longest(r: dict) -> int:
    """The longest transcript replay `r` sends, plus its answer."""
    return r["prefix"] + r["first"] + r["turns"] * (r["reply"] + r["tool_result"]) + r["reply"] + 16


def _opening(r: dict, vocab: int, agent: int) -> list[int]:
    return prompt_ids(vocab, r["prefix"], seed=11) + prompt_ids(vocab, r["first"], seed=100 + agent)


def _tool_result(r: dict, vocab: int, agent: int, turn: int) -> list[int]:
    return prompt_ids(vocab, r["tool_result"], seed=1000 + 97 * agent + turn)


def agentkv_replay(spec: dict) -> dict:
    """The replay on agentkv in this process (run it isolated): spec has model, vocab, replay
    (the workload: REPLAY's keys)."""
    import torch

    from agentkv.bench.engine import build_engine
    from agentkv.runtime.params import SamplingParams

    torch.set_num_threads(peers.THREADS)
    args = SimpleNamespace(model=spec["model"], backend="cpu", weights="resident", activation_dtype="f32")
    r = spec["replay"]
    max_len = longest(r)
    blocks = r["agents"] * -(-max_len // 16) + 64  # every agent's transcript stays cached
    engine = build_engine(args, prefix_cache=True, num_blocks=blocks, max_model_len=max_len)
    vocab = engine.vocab_size
    contexts = [_opening(r, vocab, a) for a in range(r["agents"])]
    params = SamplingParams(max_tokens=r["reply"], temperature=0.0, ignore_eos=True)
    sent = cached = 0
    t0 = time.perf_counter()
    for turn in range(r["turns"]):
        for a, context in enumerate(contexts):
            engine.add_request(f"{a}-{turn}", context, params)
            answer: list[int] = []
            while engine.has_unfinished():
                for out in engine.step():
                    answer += out.token_ids
                    cached += out.cached_len if out.finished else 0
            sent += len(context)
            contexts[a] = context + answer + _tool_result(r, vocab, a, turn)
    return _figures(sent, sent - cached, time.perf_counter() - t0)


def llama_server_replay(spec: dict, binary: Path, work: Path, timeout_s: float) -> dict:
    """The replay on llama-server (fleet flags, agent a on slot a)."""
    from agentkv.bench.llama_server import LlamaServer, fleet_flags

    if not binary.exists():
        return peers.skipped(f"no llama-server at {binary} (bench/build_llama_server.sh builds it)")
    work.mkdir(parents=True, exist_ok=True)
    r = spec["replay"]
    flags = fleet_flags(longest(r), r["agents"])
    server = LlamaServer(binary, spec["model"], flags, work / f"llama-server-replay-{Path(spec['model']).stem}.log")
    server.start(timeout_s)
    vocab = spec["vocab"]
    try:
        contexts = [_opening(r, vocab, a) for a in range(r["agents"])]
        sent = computed = 0
        t0 = time.perf_counter()
        for turn in range(r["turns"]):
            for a, context in enumerate(contexts):
                body = {"prompt": context, "n_predict": r["reply"], "ignore_eos": True, "temperature": 0.0}
                body |= {"cache_prompt": True, "id_slot": a, "return_tokens": True}
                out = server.post("/completion", body)
                sent += len(context)
                computed += out["timings"]["prompt_n"]
                contexts[a] = context + out["tokens"] + _tool_result(r, vocab, a, turn)
        return _figures(sent, computed, time.perf_counter() - t0)
    finally:
        server.stop()


def _figures(sent: int, computed: int, wall_s: float) -> dict:
    return {
        "prompt_tokens": sent,
        "computed_tokens": computed,
        "hit_rate": (sent - computed) / sent,
        "wall_s": wall_s,
    }


def run_replays(
    models: dict[str, tuple[str, int]], replay: dict, out: Path, server_binary: Path, timeout_s: float
) -> dict:
    """Workload `replay` on each model (name -> (GGUF, vocab)), agentkv (isolated) and
    llama-server: name -> arm -> figures, failures as {"error": ...}."""
    from agentkv.bench.isolate import run_isolated

    results: dict[str, dict] = {}
    for name, (model, vocab) in models.items():
        spec = {"model": model, "vocab": vocab, "replay": replay}
        log(f"replay {replay['agents']} agents x {replay['turns']} turns on {name}: agentkv ...")
        ours = run_isolated(f"{__name__}:agentkv_replay", spec, out / "runs", f"replay-{name}", timeout_s)
        log(f"replay on {name}: llama-server ...")
        try:
            theirs = llama_server_replay(spec, server_binary, out / "runs" / "llama-server", timeout_s)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            theirs = {"error": f"llama-server {server_binary}: {exc}"}
        results[name] = {"agentkv": ours, "llama-server": theirs}
    return results
