"""`agentkv bench tools`: BFCL-style tool-call accuracy through the chat API, agentkv against
llama.cpp's own server (`llama-server --jinja`) on the same GGUF, in one run.

Cases: the first `--cases` of BFCL's simple (python), multiple and parallel categories
(tools_bfcl.py: the bfcl-eval package's data, scored by its own AST checker). Each case is
one POST /v1/chat/completions with BFCL's tools as OpenAI tools, `tool_choice` auto and
required, temperature 0; a server is a child process with THREADS threads. Per engine,
choice and category: the share of cases whose answer holds calls that parse (JSON-object
arguments), BFCL's AST accuracy, and seconds per case. Gemma-3-270m's template renders no
tools (agentkv teaches it Hermes; llama.cpp's generic format), so the default model is the
packaged SmolLM2 alone."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agentkv.bench.common import bar_plot, envelope, log, print_paths, table, write_outputs
from agentkv.bench.llama_server import default_server_binary
from agentkv.bench.load_server import ServerProcess
from agentkv.bench.long_servers import agentkv_server
from agentkv.bench.peers import THREADS, skipped
from agentkv.bench.tools_bfcl import CATEGORIES, Case, check, load_cases, openai_tools


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="a GGUF (path or alias) both servers load")
    parser.add_argument("--cases", type=int, default=50, help="cases per category (the first N of BFCL's file)")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--choices", default="auto,required", help="tool_choice values to run")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: the cached build)")
    parser.add_argument("--out", default="bench/results/tools")


class LlamaServer(ServerProcess):
    """`llama-server --jinja` (the model's own chat template, its tool-call parsers), with
    `--poll 0`: its threads sleep between steps instead of spinning, which on a shared,
    oversubscribed machine is the difference between ~1 and many tokens per second."""

    name = "llama-server"

    def __init__(self, binary: str, gguf: str, log_path: str) -> None:
        super().__init__(gguf, [], log_path=log_path)
        self.binary = binary

    @property
    def command(self) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(self.port), "-t", str(THREADS), "-tb", str(THREADS)]
        return [self.binary, "-m", self.model, "--jinja", "-c", "4096", "-np", "1", "--poll", "0", *where]


def run(args: argparse.Namespace) -> int:
    from agentkv.formats.resolve import resolve_model_path

    gguf = str(resolve_model_path(args.model))
    cases = [c for cat in args.categories.split(",") for c in load_cases(cat, args.cases)]
    choices = args.choices.split(",")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        for engine in ("agentkv", "llama.cpp"):
            server = _server(engine, gguf, args.llama_server, Path(work) / f"{engine}.log")
            if isinstance(server, dict):
                results[engine] = server
                continue
            log(f"{engine}: {len(cases)} cases x {choices} ...")
            server.start()
            try:
                with urllib.request.urlopen(f"{server.base}/v1/models", timeout=60) as resp:
                    model = json.loads(resp.read())["data"][0]["id"]  # the name the server answers to
                results[engine] = {c: _arm(server.base, model, cases, c, args.max_tokens) for c in choices}
            finally:
                server.stop()
    payload = envelope("tools", model=gguf, cases_per_category=args.cases, results=results)
    return _report(Path(args.out), payload)


def _server(engine: str, gguf: str, binary: str | None, log_path: Path) -> ServerProcess | dict:
    if engine == "agentkv":
        return agentkv_server(gguf, [], 4096, log_path)
    path = Path(binary) if binary else default_server_binary()
    if not path.exists():
        return skipped(f"no llama-server at {path} (bench/build_llama_server.sh builds it)")
    return LlamaServer(str(path), gguf, str(log_path))


def _arm(base: str, model: str, cases: list[Case], choice: str, max_tokens: int) -> dict[str, dict[str, float]]:
    """Per category: cases, share whose calls parse, BFCL AST accuracy, seconds per case."""
    rows: dict[str, list[tuple[bool, bool, float]]] = {}
    for case in cases:
        t0 = time.perf_counter()
        calls = _ask(base, model, case, choice, max_tokens)
        wall = time.perf_counter() - t0
        valid = calls is not None and bool(check(case, calls).get("valid"))
        rows.setdefault(case.category, []).append((calls is not None, valid, wall))
    return {
        cat: {
            "cases": len(r),
            "parsed": sum(p for p, _, _ in r) / len(r),
            "accuracy": sum(v for _, v, _ in r) / len(r),
            "s_per_case": sum(w for _, _, w in r) / len(r),
        }
        for cat, r in rows.items()
    }


def _ask(base: str, model: str, case: Case, choice: str, max_tokens: int) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls of one answer, or None when it holds none that parse (or the server refused)."""
    body = {
        "model": model,
        "messages": case.messages,
        "tools": openai_tools(case.functions),
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            message = json.loads(resp.read())["choices"][0]["message"]
    except urllib.error.HTTPError:
        return None
    try:
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []
        ]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None
    return calls if calls and all(isinstance(a, dict) for _, a in calls) else None


def _report(out: Path, payload: dict) -> int:
    md, groups = [f"model: {payload['model']}; the first {payload['cases_per_category']} cases per category", ""], {}
    rows = []
    for engine, arms in payload["results"].items():
        if "skipped" in arms:
            md.append(f"- {engine}: skipped ({arms['skipped']})")
            continue
        for choice, cats in arms.items():
            for cat, r in cats.items():
                rows.append([engine, choice, cat, r["cases"], r["parsed"], r["accuracy"], r["s_per_case"]])
                groups.setdefault(f"{cat}", {})[f"{engine}\n{choice}"] = r["accuracy"]
    md += table(["engine", "tool_choice", "category", "cases", "calls parse", "AST accuracy", "s / case"], rows)
    png = bar_plot(out / "tools.png", "BFCL AST accuracy (share of cases)", groups, "accuracy")
    if png:
        md.append(f"\n![tools]({png.name})")
    paths = write_outputs(out, "tools", payload, md)
    print_paths({**paths, **({"png": png} if png else {})})
    return 0
