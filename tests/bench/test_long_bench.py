"""`agentkv bench long` end to end at tiny sizes against the real servers (`agentkv serve`,
llama.cpp's C++ `llama-server` and llama-cpp-python's `llama_cpp.server`), and its pieces:
the prompts' token counts, the overlap measure that says whether a server serialised its
streams, and the flags' bad-value errors."""

from __future__ import annotations

import argparse
import json

import pytest

from agentkv.bench import long as long_bench
from agentkv.bench.isolate import failed
from agentkv.bench.llama_server import server_missing
from agentkv.bench.long_client import Stream, max_overlap
from agentkv.bench.long_servers import peer_missing
from agentkv.cli import main

AGENTS, TURNS, PREFIX, ANSWER, TTFT_LEN, DECODE_LEN, STREAMS = 2, 2, 256, 8, 64, 8, 2
TINY = [
    "--models", "smollm2", "--context-models", "smollm2",
    "--agents", str(AGENTS), "--turns", str(TURNS), "--prefix", str(PREFIX), "--answer", str(ANSWER),
    "--user", "24", "--tool", "32", "--ttft-len", str(TTFT_LEN), "--depth-len", "4", "--decode-len", str(DECODE_LEN),
    "--short-len", "16", "--streams", str(STREAMS),
]  # fmt: skip


@pytest.mark.timeout(300)
def test_long_bench_both_servers_tiny(tmp_path):
    reason = peer_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    figures = ["--figures", "replay,ttft,decode,streams", "--arms", "agentkv,llamacpp"]
    rc = main(["bench", "long", *TINY, *figures, "--out", str(out)])
    payload = json.loads((out / "long.json").read_text())
    block = payload["models"]["smollm2"]
    assert rc == 0, json.dumps(block["results"], indent=1)[:3000]
    assert payload["benchmark"] == "long" and payload["sizes"]["agents"] == AGENTS
    assert block["figures"] == ["replay", "ttft", "decode", "streams"]
    assert block["derived"]["peer"] == "llamacpp"  # the second arm stands in when llama-server did not run
    ours, peer = block["results"]["agentkv"], block["results"]["llamacpp"]
    assert not failed(ours) and not failed(peer)
    for res in (ours, peer):
        assert res["replay"]["requests"] == AGENTS * TURNS and res["replay"]["wall_s"] > 0
        assert res["replay"]["completion_tokens"] > 0 and res["ttft"]["ttft_s"] > 0
        assert res["decode"]["tokens"] > 1 and res["decode"]["decode_tok_s"] > 0
        assert len(res["decode"]["runs_tok_s"]) == 3  # the median of three streams
        assert res["streams"]["streams"] == STREAMS and res["streams"]["tokens"] > 0
    # agentkv decodes exactly what was asked, and its prefix cache works over HTTP: every
    # request after turn 0 reuses at least the shared prefix's full blocks.
    assert ours["replay"]["completion_tokens"] == AGENTS * TURNS * ANSWER
    assert ours["replay"]["cached_tokens"] >= AGENTS * (TURNS - 1) * (PREFIX // 16 * 16)
    assert (ours["ttft"]["prompt_tokens"], ours["ttft"]["cached_tokens"]) == (TTFT_LEN, 0)
    assert peer["ttft"]["prompt_tokens"] == TTFT_LEN  # the same prompt length in its tokenizer
    assert ours["ttft"]["prefill_tok_s"] > 0 and peer["ttft"]["decode_at_depth_tok_s"] > 0
    assert ours["decode"]["tokens"] == DECODE_LEN and ours["streams"]["tokens"] == STREAMS * DECODE_LEN
    assert ours["streams"]["max_concurrent"] == STREAMS  # batched, not one after another
    derived = block["derived"]
    assert derived["decode_ceiling_tok_s"] > 0 and set(derived["of_ceiling"]) == {"agentkv", "llamacpp"}
    for figure in ("replay", "ttft", "decode", "streams"):
        assert derived["ratios"][figure]["agentkv_over_peer"] > 0
    assert "--cache" in peer["command"] and "--interrupt_requests" in peer["command"]
    assert payload["llamacpp_build"]["system_info"] and payload["bandwidth"]["best_gbs"] > 0
    assert "agentkv ÷ peer" in (out / "long.md").read_text()
    assert (out / "long.png").stat().st_size > 1000


def test_prompts_have_the_token_counts_asked():
    from agentkv.bench import workloads as wl
    from agentkv.bench.long_prompts import Sizes, build, words
    from agentkv.formats.resolve import open_model
    from agentkv.formats.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(open_model("smollm2"))
    chat = wl.ChatPieces(tokenizer)
    text = words(chat, 100, 1)
    assert len(tokenizer.encode(text, add_special_tokens=False)) == 100
    assert words(chat, 100, 2) != text  # each seed its own prompt
    s = Sizes(2, 2, 128, 24, 8, 32, 300, 4, 8, 16, 3)
    p = build("smollm2", ["replay", "ttft", "streams"], s)
    first = tokenizer.encode(p.segments[0][0], add_special_tokens=False)
    assert len(first) == 128 + 24  # the system prompt and the first agent's task
    assert len(p.streams) == 3 and len(set(p.streams)) == 3 and p.decode not in p.streams
    assert p.max_context >= 300 + 4 + 1


def _stream(first: float, done: float) -> Stream:
    return Stream(0.0, [first, (first + done) / 2], done, "", 2, "length", None, None)


def test_overlap_tells_serialised_from_concurrent_streams():
    serial = [_stream(0.0, 1.0), _stream(1.5, 2.0), _stream(2.5, 3.0)]
    assert max_overlap(serial) == 1
    together = [_stream(0.0, 1.0), _stream(0.1, 2.0), _stream(0.9, 3.0)]
    assert max_overlap(together) == 3


def test_bad_flags_name_the_value():
    parser = argparse.ArgumentParser()
    long_bench.add_arguments(parser)
    with pytest.raises(ValueError, match="'latency'"):
        long_bench.plan(parser.parse_args(["--figures", "replay,latency"]))
    with pytest.raises(ValueError, match="--agents 0"):
        long_bench.sizes(parser.parse_args(["--agents", "0"]))
    with pytest.raises(ValueError, match="'vllm'"):
        long_bench.choices("agentkv,vllm", long_bench.ARMS, "--arms")
    assert long_bench.plan(parser.parse_args(["--figures", "decode,ttft", "--models", "gemma3-270m"])) == {
        "smollm2": ["ttft"],
        "gemma3-270m": ["decode"],
    }


@pytest.mark.timeout(300)
def test_the_int8_arm_serves_with_int8_activations(tmp_path):

    out = tmp_path / "out"
    arms = ["--arms", "agentkv,agentkv-int8", "--figures", "decode"]
    assert main(["bench", "long", *TINY, *arms, "--out", str(out)]) == 0
    payload = json.loads((out / "long.json").read_text())
    res = payload["models"]["smollm2"]["results"]
    assert res["agentkv-int8"]["command"][-2:] == ["--activation-dtype", "int8"]
    assert res["agentkv"]["command"][-2:] == ["--activation-dtype", "f32"]  # not the CPU's "auto"
    assert res["agentkv-int8"]["decode"]["tokens"] == DECODE_LEN
    assert payload["models"]["smollm2"]["derived"]["ratios"]["decode"]["int8_over_peer"] is None  # no peer ran
    assert "agentkv int8" in (out / "long.md").read_text()


@pytest.mark.timeout(300)
def test_long_bench_llama_server_tiny(tmp_path):
    """llama.cpp's C++ server as the peer: the replay and the fleet (each agent its own turns,
    all at once) on its parallel slots, its prompt cache reused across turns, TTFT and decode;
    the JSON names its flags, its build and its system-info line. Then the ratios take it as
    the peer over llama_cpp.server."""
    reason = server_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    args = ["--figures", "replay,fleet,ttft,decode", "--arms", "llama-server", "--prefix", "64", "--answer", "4"]
    rc = main(["bench", "long", *TINY, *args, "--ttft-len", "32", "--decode-len", "4", "--out", str(out)])
    payload = json.loads((out / "long.json").read_text())
    block = payload["models"]["smollm2"]
    assert rc == 0, json.dumps(block["results"], indent=1)[:3000]
    peer = block["results"]["llama-server"]
    assert not failed(peer)
    assert {"-np", "--kv-unified", "--cache-reuse", "-cram"} <= set(peer["command"])
    assert "AVX2 = 1" in peer["system_info"] and payload["llama_server_build"]["build_flags"]["GGML_NATIVE"] == "OFF"
    for figure in ("replay", "fleet"):
        assert peer[figure]["requests"] == AGENTS * TURNS and peer[figure]["completion_tokens"] == AGENTS * TURNS * 4
        assert peer[figure]["cached_tokens"] > 0  # its prompt cache kept a turn's context for the next
    assert len(peer["fleet"]["agent_s"]) == AGENTS and max(peer["fleet"]["agent_s"]) <= peer["fleet"]["wall_s"]
    assert peer["ttft"]["prompt_tokens"] == 32 and peer["decode"]["tokens"] == 4
    assert payload["isa"]["agentkv_kernels"] in ("avx2", "avx512")
    assert payload["isa"]["agentkv_int8_kernels"] in ("avx2", "avx512-vnni")
    # with llama_cpp.server's result beside it, llama-server stays the peer of the ratios
    results = {"agentkv": peer, "llama-server": peer, "llamacpp": {**peer, "replay": {"wall_s": 1e9}}}
    derived = long_bench.derive("smollm2", results, 10.0)
    assert derived["peer"] == "llama-server" and derived["ratios"]["fleet"]["agentkv_over_peer"] == 1.0
    assert derived["ratios"]["replay"]["agentkv_over_llama_cpp_server"] > 1e3
