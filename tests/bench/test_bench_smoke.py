"""`agentkv bench agents --quick` end to end on tiny workloads (no peers needed)."""

from __future__ import annotations

import json

from agentkv.cli import main


def test_bench_agents_quick_smoke(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "agents",
            "--quick",
            "--peers",
            "agentkv,agentkv-nocache",
            "--workload",
            "fak-agents,tool-loop",
            "--out",
            str(tmp_path),
            "--no-profile",
            "--set",
            "fak-agents.agents=2",
            "--set",
            "fak-agents.turns=2",
            "--set",
            "fak-agents.prefix=16",
            "--set",
            "fak-agents.append=8",
            "--set",
            "tool-loop.turns=2",
            "--set",
            "tool-loop.answer=4",
        ]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "agents-quick.json").read_text())
    assert {"machine", "versions", "commit", "date"} <= payload.keys()
    by_name = {w["workload"]: w for w in payload["workloads"]}
    for name, work in by_name.items():
        assert work["exactness"]["exact"] is True, name
        assert work["accounting"]["agentkv_hits_match"] is True, name
        for arm in ("agentkv", "agentkv-nocache"):
            assert "error" not in work["arms"][arm], work["arms"][arm].get("error")
    fak = by_name["fak-agents"]
    assert fak["accounting"]["radixbench"]["total_tokens"] == 2 * (24 + 32)
    assert fak["arms"]["agentkv-nocache"]["prefill_computed"] == 112
    assert fak["arms"]["agentkv"]["prefill_computed"] == 112 - fak["accounting"]["agentkv_expected_hits"]
    tool = by_name["tool-loop"]
    assert tool["arms"]["agentkv"]["counters"]["generation_tokens"] == 2 * 2 * 4
    assert (tmp_path / "agents-quick.md").read_text().count("| agentkv |") == 2
    for name in by_name:
        assert (tmp_path / f"agents-quick-{name}.png").stat().st_size > 1000
    assert "exactness" in capsys.readouterr().out


def test_bench_agents_llama_server_arm(tmp_path):
    """llama.cpp's C++ server as an arm of `bench agents`: fed agentkv's transcript (token-id
    prompts), its slots reuse each agent's cached context (cache_n), its answers are counted."""
    import pytest

    from agentkv.bench.llama_server import server_missing

    reason = server_missing()
    if reason:
        pytest.skip(reason)
    sets = ["tool-loop.agents=2", "tool-loop.turns=2", "tool-loop.answer=4", "tool-loop.prefix=64"]
    args = ["--quick", "--peers", "agentkv,llama-server", "--workload", "tool-loop", "--no-profile"]
    rc = main(["bench", "agents", *args, "--out", str(tmp_path), *[x for s in sets for x in ("--set", s)]])
    assert rc == 0
    payload = json.loads((tmp_path / "agents-quick.json").read_text())
    assert payload["llama_server_build"]["build_flags"]["GGML_NATIVE"] == "OFF"
    peer = payload["workloads"][0]["arms"]["llama-server"]
    assert "error" not in peer, peer.get("error")
    assert "AVX2 = 1" in peer["notes"] and peer["requests"] == 4
    assert sum(r["num_generated"] for r in peer["records"]) == 2 * 2 * 4
    assert peer["prefix_hit_tokens"] > 0  # turn 1 reuses each agent's turn-0 context
