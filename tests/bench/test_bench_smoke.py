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
