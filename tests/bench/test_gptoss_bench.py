"""`agentkv bench gptoss` on a tiny shape of gpt-oss's layout: the run writes every figure for
agentkv (MXFP4 experts on the compiled path) and llama-server's arm where the binary is built,
otherwise reports it as skipped."""

from __future__ import annotations

import json
import statistics

from agentkv.bench.llama_server import server_missing
from agentkv.cli import main
from agentkv.hal.registry import lookup

TINY = ["--layers=2", "--d=256", "--ffn=256", "--heads=4", "--kv-heads=2", "--experts=4", "--top-k=2", "--vocab=400"]


def test_bench_gptoss_writes_every_figure(tmp_path):
    """Two rounds (each figure the median of its arm's rounds) and, where VNNI is, the int8 arm."""
    int8 = "int8" in lookup("cpu").activation_dtypes()
    rc = main(
        ["bench", "gptoss", *TINY, "--prompt-len", "32", "--decode-len", "2", "--rounds", "2"]
        + ["--int8"] * int8
        + ["--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "gptoss.json").read_text())
    arms = {"agentkv": "f32", "agentkv-int8": "int8"} if int8 else {"agentkv": "f32"}
    for arm, dtype in arms.items():
        ours = payload["results"][arm]
        for key in ("prefill_tok_s", "decode_tok_s", "first_prefill_s", "rss_mib", "kv_bytes_per_token"):
            assert ours[key] > 0, key
            assert ours[key] == statistics.median(r[key] for r in ours["rounds"]), key
        assert len(ours["rounds"]) == 2 and ours["activation_dtype"] == dtype
        assert "long_decode_tok_s" not in ours  # no long prompt unless asked
    peer = payload["results"]["llama-server"]
    if server_missing():
        assert peer.get("skipped"), peer
    else:
        assert set(payload["ratios"]["vs_llama_server"]) == {"prefill_tok_s", "decode_tok_s"}
