"""Every `agentkv bench` subcommand end to end on tiny settings without peers: each writes
well-formed JSON with the envelope, and a peer that cannot run is reported as skipped."""

from __future__ import annotations

import json

import pytest

from agentkv.bench import forward, peers
from agentkv.bench.isolate import failed, run_isolated
from agentkv.cli import main

ENVELOPE = {"benchmark", "date", "commit", "command", "machine", "versions"}


def _payload(path, benchmark: str) -> dict:
    payload = json.loads(path.read_text())
    assert ENVELOPE <= payload.keys()
    assert payload["benchmark"] == benchmark
    return payload


def test_forward_without_peers(tmp_path):
    rc = main(
        [
            "bench",
            "forward",
            "--peers",
            "",
            "--prompt-len",
            "16",
            "--decode-len",
            "2",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    payload = _payload(tmp_path / "forward-smollm2-resident.json", "forward")
    ours = payload["results"]["agentkv"]
    assert not failed(ours), ours
    assert ours["prefill_tok_s"] > 0 and ours["decode_tok_s"] > 0
    assert payload["ratios"] == {}
    assert (tmp_path / "forward-smollm2-resident.png").stat().st_size > 1000


def test_quant_agentkv_only(tmp_path):
    rc = main(
        [
            "bench",
            "quant",
            "--models",
            "smollm2",
            "--arms",
            "agentkv-resident",
            "--prompt-len",
            "16",
            "--decode-len",
            "2",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    payload = _payload(tmp_path / "quant.json", "quant")
    block = payload["models"]["smollm2"]
    ours = block["results"]["agentkv-resident"]
    assert not failed(ours), ours
    assert ours["weight_tensor_mib"] > 50  # SmolLM2-135M Q4_1 holds ~92 MiB of weights
    assert block["derived"]["weights_vs_gguf"]["agentkv-resident"] == pytest.approx(1.0, abs=0.05)
    assert "vs_llamacpp" not in block["derived"]  # no peer ran: no ratio is made up


def test_cache_tiny(tmp_path):
    rc = main(
        [
            "bench",
            "cache",
            "--agents",
            "2",
            "--turns",
            "2",
            "--prefix",
            "16",
            "--user",
            "4",
            "--answer",
            "2",
            "--tool",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    payload = _payload(tmp_path / "cache.json", "cache")
    fak, session = payload["workloads"]
    assert fak["accounting"]["agentkv_measured_hits"] == 5512
    assert session["exactness"]["exact"] is True
    assert session["accounting"]["agentkv_hits_match"] is True


def test_kernels_tiny(tmp_path):
    from agentkv.hal.kernels import load

    if load() is None:
        pytest.skip("agentkv CPU kernels cannot be built here")
    rc = main(["bench", "kernels", "--seconds", "0.01", "--m", "1", "--out", str(tmp_path)])
    assert rc == 0
    payload = _payload(tmp_path / "kernels.json", "kernels")
    assert [r["m"] for r in payload["shapes"]] == [1] * 5
    assert all(r["speedup"] > 0 for r in payload["shapes"])
    long = payload["attention"]["long_decode"]
    assert long["context"] == 8192 and long["decode_f32_us"] > 0 and long["decode_f16_us"] > 0
    mxfp4 = {(r["format"], r["m"]): r for r in payload["mxfp4"]["rows"]}
    assert set(mxfp4) == {("MXFP4", 1), ("Q4_0", 1)} and all(r["gbs"] > 0 for r in mxfp4.values())
    # the prefill figure on every ISA the CPU runs, each run on its own ISA
    peak = payload["prefill_peak"]
    runs = {r["isa"]: r for r in peak["runs"]}
    assert set(runs) == {isa for isa in ("avx2", "avx512") if load().isa_supported(isa)}
    for run in runs.values():
        assert run["fma_peak_gflops"] > 0 and run["model_gflops"] > 0 and run["shapes"]
        assert all(r["layers"] >= 1 and r["gflops"] > 0 for r in run["shapes"])


def test_missing_peer_is_skipped_not_passed(tmp_path, monkeypatch):
    monkeypatch.setitem(peers.PEERS, "nosuchpeer", "agentkv_no_such_module")
    monkeypatch.setitem(peers.INSTALL, "nosuchpeer", "nowhere")
    results = forward.run_arms("agentkv.bench.forward:worker", {"nosuchpeer": {"arm": "nosuchpeer"}}, tmp_path, 60)
    assert results == {"nosuchpeer": {"skipped": "agentkv_no_such_module is not installed (nowhere)"}}
    assert forward.ratios({"agentkv": {"prefill_tok_s": 2.0, "decode_tok_s": 1.0}, **results}) == {}
    # Control: an installed peer is not reported missing.
    assert peers.missing("transformers") is None


def test_timeout_is_skipped_and_a_finished_arm_returns(tmp_path):
    assert run_isolated("time:sleep", 60, tmp_path, "slow", timeout_s=3) == {"skipped": "timed out after 3 s"}
    assert run_isolated("json:dumps", [1, 2], tmp_path, "fast", timeout_s=60) == "[1, 2]"
    crashed = run_isolated("json:loads", "{", tmp_path, "crash", timeout_s=60)
    assert "JSONDecodeError" in crashed["error"]


@pytest.mark.parametrize(
    "argv, bad",
    [
        (["quant", "--arms", "nope"], "'nope'"),
        (["forward", "--peers", "nope"], "'nope'"),
        (["agents", "--workload", "nope"], "'nope'"),
        (["agents", "--set", "tool-loop.turns=x"], "tool-loop.turns=x"),
        (["kernels", "--seconds", "0"], "--seconds 0"),
        (["kernels", "--step-rows", "4", "0"], "--step-rows [4, 0]"),
    ],
)
def test_bad_flags_name_the_value(argv, bad, capsys):
    assert main(["bench", *argv, "--out", "/nonexistent/never-written"]) == 2
    assert bad in capsys.readouterr().err


def test_prefill_peak_counts_each_layer_matrix_and_leaves_out_the_output():
    from agentkv.bench.kernels_peak import layer_shapes

    weights = {
        "token_embd.weight": (None, 8, 49152, 576),
        "output.weight": (None, 8, 49152, 576),
        "blk.0.attn_q.weight": (None, 3, 576, 576),
        "blk.1.attn_q.weight": (None, 3, 576, 576),
        "blk.0.ffn_down.weight": (None, 3, 576, 1536),
    }
    assert layer_shapes(weights) == {(3, 576, 576): 2, (3, 576, 1536): 1}
