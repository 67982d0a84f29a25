"""Warm restarts across processes: a real `agentkv serve` over HTTP stopped with SIGTERM and
restarted on the same --kv-cache-dir, and a forced other ISA that must reuse nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from agentkv.commands.ports import free_port
from tests.runtime.test_exactness import qwen2_dir  # noqa: F401  (fixture)
from tests.runtime.test_warm_restart import ROOT, engine, run, transcript

AGENTKV = [sys.executable, "-m", "agentkv.cli"]


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


class Server:
    """`agentkv serve` in a subprocess on 127.0.0.1, stopped with SIGTERM (uvicorn's graceful
    shutdown, which runs the engine's close)."""

    def __init__(self, model: str, *flags: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                *AGENTKV,
                "serve",
                model,
                "--port",
                str(self.port),
                "--block-size",
                "16",
                "--kv-cache-blocks",
                "64",
                "--served-model-name",
                "tiny",
                *flags,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read()) from None
                time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        self.log = self.proc.stderr.read()
        return code


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client's own text parser: (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def disk_metric(samples: dict, name: str, **labels: str) -> float:
    return samples[(f"agentkv_kv_disk_{name}", tuple(sorted(labels.items())))]


def completion(port: int, prompt: list[int]) -> tuple[int, list]:
    out = post(port, {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 5})
    choice = out["choices"][0]
    details = out["usage"].get("prompt_tokens_details") or {}
    return details.get("cached_tokens", 0), [
        choice["logprobs"]["token_logprobs"],
        choice["logprobs"]["top_logprobs"],
        choice["text"],
    ]


def test_served_warm_restart_is_exact(qwen2_dir, tmp_path):  # noqa: F811
    prompt = transcript(21, 300)
    cold = Server(qwen2_dir, "--no-prefix-cache")
    try:
        _, want = completion(cold.port, prompt)
    finally:
        cold.stop()
    first = Server(qwen2_dir, "--kv-cache-dir", str(tmp_path))
    try:
        assert completion(first.port, prompt) == (0, want)
        before = scrape(first.port)
    finally:
        assert first.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    assert "Application shutdown complete" in first.log  # the graceful path ran
    assert len(list(tmp_path.glob("kv-v2-*/g-*/*.kvb"))) >= 300 // 16  # SIGTERM wrote RAM back
    files = sorted(tmp_path.glob("kv-v2-*/g-*/*.kvb"))
    stale = files[0].parent / ".stale.999999999.tmp"  # a pid past pid_max: its writer is gone
    stale.write_bytes(b"what a writer killed mid-file leaves")
    second = Server(qwen2_dir, "--kv-cache-dir", str(tmp_path))
    try:
        cached, got = completion(second.port, prompt)
        after = scrape(second.port)
    finally:
        second.stop()
    assert cached >= 0.9 * len(prompt)
    assert got == want  # logprobs as JSON floats: equal to the last bit
    assert disk_metric(before, "hit_blocks_total") == 0 and disk_metric(before, "written_blocks_total") == 0
    assert disk_metric(after, "hit_blocks_total") == cached // 16
    assert disk_metric(after, "hit_tokens_total") == cached
    assert disk_metric(after, "loads_total") == 1
    kv_bytes = 2 * 2 * 16 * 2 * 16 * 2  # layers, K and V, block, kv heads, head dim, f16 (the default)
    assert cached // 16 * kv_bytes < disk_metric(after, "bytes_read_total") < cached // 16 * (kv_bytes + 4096)
    assert disk_metric(after, "files") == len(files) and disk_metric(after, "read_only") == 0
    assert disk_metric(after, "ignored_files_total", reason="stale_tmp") == 1
    assert disk_metric(after, "ignored_files_total", reason="corrupt") == 0


PROBE = textwrap.dedent("""
    import sys
    from tests.runtime.test_warm_restart import engine, run, transcript
    e = engine(sys.argv[1], sys.argv[2])
    cached, _ = run(e, transcript(31, 200))
    print(cached, e.disk.stats().hit_blocks, e.backend.identity.isa)
""")


def _has_avx512() -> bool:
    return "avx512f" in Path("/proc/cpuinfo").read_text()


@pytest.mark.skipif(not _has_avx512(), reason="needs a CPU with AVX-512 to force the other ISA")
def test_another_isa_reuses_nothing(qwen2_dir, tmp_path):  # noqa: F811
    writer = engine(qwen2_dir, tmp_path)
    assert writer.backend.identity.isa == "avx512"
    run(writer, transcript(31, 200))
    writer.close()

    def probe(isa: str) -> list[str]:
        env = {**os.environ, "AGENTKV_CPU_ISA": isa}
        done = subprocess.run(
            [sys.executable, "-c", PROBE, qwen2_dir, str(tmp_path)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert probe("avx2") == ["0", "0", "avx2"]
    cached, hits, isa = probe("avx512")  # the control: the same ISA does hit
    assert int(cached) == 192 and int(hits) == 12 and isa == "avx512"
