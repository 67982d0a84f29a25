"""`agentkv bench load` tiny and end to end: 8 streaming clients against a real `agentkv serve`
child process (at most 2 running, and a queue of 2 where the server has admission control),
a disconnect storm, and a kill -9 followed by a restart."""

from __future__ import annotations

import json

import pytest

from agentkv.bench.load_clients import check_stream
from agentkv.bench.load_server import parse_metrics
from agentkv.cli import main

pytestmark = pytest.mark.slow

GOOD = [
    json.dumps(c)
    for c in (
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": "Apple"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
    )
] + ["[DONE]"]


def test_stream_checker_accepts_whole_streams_only():
    assert check_stream(GOOD) == (1, None)
    assert check_stream(GOOD[:-1])[1] == "stream did not end with [DONE]"
    assert check_stream(GOOD[1:])[1] == "first chunk has no assistant role"
    assert check_stream(GOOD[:2] + GOOD[3:])[1].startswith("finish reasons")
    assert check_stream(GOOD[:3] + ["[DONE]"])[1] == "no usage chunk"
    assert check_stream(GOOD[:1] + ['{"error": {"message": "boom"}}'] + GOOD[1:])[1].startswith("error event")


def test_metrics_parser_reads_unlabelled_samples():
    page = '# HELP x y\nagentkv_kv_blocks_free 61.0\nagentkv_requests_total{endpoint="/health"} 3.0\n'
    assert parse_metrics(page) == {"agentkv_kv_blocks_free": 61.0}


def test_load_tiny(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "load",
            "--clients",
            "8",
            "--max-tokens",
            "16",  # long enough that the first four are still streaming when the last four arrive
            "--max-queued-requests",
            "2",
            "--max-model-len",
            "128",
            "--serve-arg=--max-num-seqs=2",
            "--serve-arg=--kv-cache-blocks=64",
            "--out",
            str(tmp_path),
        ]
    )
    payload = json.loads((tmp_path / "load.json").read_text())
    result = payload["result"]
    assert rc == 0, result
    assert payload["passed"] is True
    assert {"machine", "versions", "commit", "date"} <= payload.keys()
    load, storm, kill = result["load"], result["storm"], result["kill"]
    assert load["completed"] + load["rejected"] == 8 and load["completed"] >= 2
    assert storm["completed"] + storm["rejected"] + storm["left"] == 8 and storm["left"] >= 1
    if payload["server"]["admission_flag"]:
        assert load["rejected"] >= 1  # 8 clients against 2 running + 2 queued
    assert result["responses_5xx"] == 0 and result["streams_malformed"] == 0
    assert result["leaked_blocks"] == 0 and storm["idle_after_s"] <= 1.0
    assert storm["pool_after"]["running"] == 0 and storm["pool_after"]["used"] == storm["pool_after"]["cached"]
    assert kill["exit_code"] == -9 and kill["served_after_restart"] is True
    assert kill["streams_cut"] >= 1 and kill["streams_cut"] + kill["completed_before_kill"] == 2
    assert (tmp_path / "load.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "requests completed" in out and "leaked blocks 0" in out
