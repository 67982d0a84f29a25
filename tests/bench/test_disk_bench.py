"""`agentkv bench disk` end to end on a short prefix: the warm arm after a restart hits every
full block from disk and gives the cold arm's first token; a run whose warm token differs is
reported as failed (the control)."""

from __future__ import annotations

import json

from agentkv.bench.disk import problems
from agentkv.bench.isolate import failed
from agentkv.cli import main


def test_disk_bench_short_prefix(tmp_path):
    rc = main(["bench", "disk", "--prefix-len", "64", "--out", str(tmp_path / "out")])
    assert rc == 0, (tmp_path / "out" / "disk.md").read_text()
    payload = json.loads((tmp_path / "out" / "disk.json").read_text())
    assert payload["benchmark"] == "disk" and payload["prefix_len"] == 64
    arms = payload["arms"]
    cold, warm, read = arms["cold"], arms["warm-disk"], arms["read"]
    assert cold["cached"] == 0 and cold["written_blocks"] == 4 and cold["hit_blocks"] == 0
    assert warm["cached"] == 48 and warm["hit_blocks"] == 3 and warm["ignored_files"] == 0
    assert (warm["token"], warm["logprob"]) == (cold["token"], cold["logprob"])
    assert read["blocks"] == 3 and read["files"] == 4 and read["read_mb_s"] > 0
    assert cold["write_mb_s"] > 0
    peer = arms["llama.cpp"]
    assert "skipped" in peer or not failed(peer), peer  # never an error passed off as a result
    assert (tmp_path / "out" / "disk.png").stat().st_size > 1000


def test_problems_catch_an_inexact_or_missing_warm_hit():
    cold = {"token": 5, "logprob": -1.25, "cached": 0}
    warm = {"token": 5, "logprob": -1.25, "cached": 48}
    arms = {"cold": cold, "warm-disk": warm, "read": {}, "llama.cpp": {"skipped": "not here"}}
    assert problems(arms, 64) == []
    assert problems({**arms, "warm-disk": {**warm, "logprob": -1.2500001}}, 64)
    assert problems({**arms, "warm-disk": {**warm, "cached": 32}}, 64)
    assert problems({**arms, "read": {"error": "exit 1"}}, 64) == ["read: error: exit 1"]
