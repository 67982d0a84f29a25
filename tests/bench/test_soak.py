"""`agentkv bench soak` end to end, short: mixed traffic against a real `agentkv serve` child
process with the disk tier, speculation, two tenants and pins, then its checks (RSS flat, no
5xx, no leaked block, integrity at shutdown, answers equal to a cold server's). The committed
run is 30 minutes (bench/results/soak); CI runs it for SOAK_S seconds."""

from __future__ import annotations

import json

import pytest

from agentkv.bench.soak import rss_check
from agentkv.cli import main

pytestmark = pytest.mark.slow
SOAK_S = 120


def test_rss_check_measures_growth_after_the_warm_up_only():
    rss = [(0.0, 100.0), (10.0, 300.0), (20.0, 500.0), (30.0, 505.0), (40.0, 510.0), (50.0, 508.0)]
    check = rss_check(rss, warmup_frac=0.4)
    assert check["warm_mib"] == 500.0 and check["max_after_warmup_mib"] == 510.0
    assert abs(check["growth_after_warmup"] - 0.02) < 1e-9
    assert rss_check([(0.0, 100.0), (10.0, 200.0)], 0.0)["growth_after_warmup"] == 1.0  # a leak shows


def test_a_short_soak_passes_every_check(tmp_path):
    code = main(
        ["bench", "soak", "--duration-s", str(SOAK_S), "--sample-s", "2", "--replay", "4", "--out", str(tmp_path)]
    )
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["checks"] == {
        "rss_flat": True,
        "no_5xx": True,
        "no_leaked_blocks": True,
        "integrity": True,
        "answers_equal_cold": True,
    }, report
    assert code == 0 and report["requests"] > 20 and (tmp_path / "soak.png").exists()
    kinds = set(report["statuses"])
    assert kinds == {"chat", "stream", "tools", "anthropic_pins", "abort", "slow_reader", "bad_body"}
    assert set(report["statuses"]["bad_body"]) == {"400"}  # a bad body is the API's 400, never a 5xx
