"""The console script end to end: generate, chat (piped stdin), witness."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

AGENTKV = [sys.executable, "-m", "agentkv.cli"]


def agentkv(*args: str, stdin: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENTKV, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def test_generate_json_greedy_is_reproducible():
    args = ("generate", "smollm2", "The capital of France is", "--max-tokens", "6", "--json")
    first, second = agentkv(*args), agentkv(*args)
    assert first.returncode == 0, first.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == 6
    assert a["finish_reason"] == "length" and "Paris" in a["text"]


def test_generate_bad_parameter_is_a_clear_error():
    r = agentkv("generate", "smollm2", "hi", "--top-p", "1.5")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr


def test_chat_streams_resets_and_quits_on_eof():
    r = agentkv("chat", "smollm2", "--max-tokens", "5", stdin="Hello!\n/reset\nWhat is 2+2?\n")
    assert r.returncode == 0, r.stderr
    assert "(conversation reset)" in r.stderr
    assert r.stdout.count("> ") >= 3 and len(r.stdout.strip()) > 10


@pytest.mark.parametrize("backend", ["cpu", "torch", "reference"])
def test_witness_ops_pass(backend):
    r = agentkv("witness", "--backend", backend, "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"]
    assert {row["status"] for row in report["rows"]} == {"PASS"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_witness_without_cuda_is_skip_and_nonzero():
    r = agentkv("witness", "--backend", "torch-cuda")
    assert r.returncode != 0 and "SKIP" in r.stdout and "CUDA" in r.stdout


# Run in a child: freezing is process-wide, and the test process's own heap must stay collectable.
SERVE_LOAD = """
import argparse, gc, json
from agentkv.commands.serve import add_arguments, loader
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args(["smollm2", "--max-model-len", "256", "--kv-cache-blocks", "32"])
before = gc.get_freeze_count()
engine = loader(args)()
frozen = gc.get_freeze_count()
print(json.dumps({"before": before, "frozen": frozen, "tracked": len(gc.get_objects())}))
"""


def test_the_serve_loader_leaves_its_heap_frozen_out_of_collections():
    r = subprocess.run([sys.executable, "-c", SERVE_LOAD], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout.splitlines()[-1])
    # nothing was frozen before the load; after it, more objects are frozen than the tokenizer's
    # 49,152-entry vocabulary, and fewer than that are left for a collection to scan
    assert counts["before"] == 0
    assert counts["frozen"] > 49152 > counts["tracked"]
