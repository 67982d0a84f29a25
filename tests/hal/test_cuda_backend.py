"""The `cuda` backend (Triton kernels, hal/cuda): refused with its cause where there is no
device, its kernels checked under Triton's interpreter on the host (in a process of its own:
tests/hal/cuda_interp.py), and on a device when there is one (the `cuda` marker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from agentkv.cli import main
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.registry import lookup
from agentkv.runtime.runner import Chunk
from agentkv.witness.cuda_ops import MODELS
from tests.hal.subproc import ROOT

pytest.importorskip("triton", reason="the cuda backend's kernels are Triton")
NO_DEVICE = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_DEVICE, reason="checks the path without a CUDA device")
def test_cuda_is_refused_with_its_cause_without_a_device():
    with pytest.raises(BackendUnavailable, match=r"backend 'cuda' needs a CUDA device and none is present"):
        lookup("cuda")


@pytest.mark.skipif(not NO_DEVICE, reason="checks the path without a CUDA device")
def test_witness_reports_skip_never_pass_without_a_device(capsys):
    assert main(["witness", "--backend", "cuda", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [(r["op"], r["status"]) for r in report["rows"]] == [("backend", "SKIP")] + [
        (f"model/{name}", "SKIP") for name in MODELS
    ]
    assert all("needs a CUDA device" in r["note"] for r in report["rows"])


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """One run of tests/hal/cuda_interp.py under TRITON_INTERPRET=1 (~30 s on 2 cores)."""
    folder = tmp_path_factory.mktemp("cuda_interp")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests/hal/cuda_interp.py"), str(folder)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_interpreted_kernels_are_witnessed_against_the_reference(interpreted):
    rows = interpreted["witness"]
    failed = [r for r in rows if r["status"] != "PASS"]
    assert not failed, failed
    ops = {r["op"].split("/")[0] + ("/" + r["op"].split("/")[1] if r["op"].startswith("matmul/") else "") for r in rows}
    for op in ("matmul", "rms_norm", "add_norm", "glu", "attention", "attention_inputs", "embedding"):
        assert op in ops, op
    for fmt in ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "I4G32", "I8G32", "F8G32", "MXFP4"):
        assert f"matmul/{fmt}" in ops, fmt
    assert {"attention_sinks/window=8", "attention_sinks/window=128"} <= {r["op"] for r in rows}
    assert {"attention/ranges/kv=f32", "attention/ranges/kv=f16"} <= {r["op"] for r in rows}
    assert "moe_ffn/sigmoid_groups_bias" in {r["op"] for r in rows}  # the router's correction bias reaches the launch
    assert interpreted["identity"][:3] == ["cuda", "cpu", "triton-interpreter"]


def test_interpreted_kernels_are_row_invariant_and_the_check_can_fail(interpreted):
    """Each row alone == in a batch of 5 == in chunks of 2 + 3, bit for bit (np.array_equal);
    the control picks tiles by the row count, as an autotuner keyed on M would, and is caught."""
    results = dict(interpreted["invariance"])
    control = results.pop("control/tiles_by_row_count")
    assert len(results) == 15 and all(broken == [] for broken in results.values()), results
    assert "chunked" in control and len(control) > 1


def test_interpreted_model_matches_the_reference_and_every_split(interpreted):
    """A tiny llama GGUF with every resident format: logits against the reference, and the
    same rows in one chunk, in two, and as a decode step batched with another sequence."""
    m = interpreted["model"]
    assert m["cosine"] >= 0.9999 and m["argmax_equal"], m
    assert m["chunked_equal"] and m["decode_in_batch_equal"], m
    assert m["control_rows_differ"], m  # the rows compared are not trivially equal
    assert m["step_off_dtype"] == [] and m["step_results"] > 0, m  # every op hands back f32 (test_ledger.py)


def test_a_decode_step_reads_the_host_only_at_its_fences(interpreted):
    """The seventh fence: no host read (a sync on a device) in a step (a decode row batched
    with another sequence's chunk) but the backend's `read`/`argmax`; the control hides one
    in matmul and is caught at each of its calls."""
    step, control = interpreted["model"]["step_host_reads"], interpreted["fence_control"]
    assert step["hidden"] == [] and step["fenced"] >= 1, step
    assert control["leaks"] >= 10 and len(control["hidden"]) == control["leaks"], control
    assert all(h.startswith("__float__ at ") and "cuda_interp_model.py" in h for h in control["hidden"]), control


def test_the_expert_dispatch_is_exact_and_reads_nothing_back(interpreted):
    """The grouped MoE dispatch (hal/cuda/moe.py) on a tiny Qwen3-MoE GGUF (Q8_0 and F16
    experts): logits against the reference; one chunk == two == a decode row in a batch; no
    host read in that step. The control (the portable dispatch) gives the same bits but reads
    each layer's expert counts back, and the count catches both."""
    m = interpreted["moe"]
    assert m["cosine"] >= 0.9999 and m["argmax_equal"], m
    assert m["chunked_equal"] and m["decode_in_batch_equal"] and m["control_rows_differ"], m
    assert m["step_host_reads"]["hidden"] == [] and m["step_host_reads"]["fenced"] >= 1, m
    control = m["control_host_reads"]
    assert control["equal"] and len(control["hidden"]) == 2, control
    assert all(h.startswith("tolist at ") and "portable/moe.py" in h for h in control["hidden"]), control


def test_gpt_oss_runs_exactly_and_reads_nothing_back(interpreted):
    """The tiny gpt-oss (MXFP4 experts with biases, attention sinks, a 16-token window crossed
    by an 18-token prompt) on the `cuda` kernels: logits against the reference; one chunk ==
    two == a decode row in a batch; no host read in that step (the grouped biased experts)."""
    m = interpreted["gpt_oss"]
    assert m["cosine"] >= 0.9999 and m["argmax_equal"], m
    assert m["chunked_equal"] and m["decode_in_batch_equal"] and m["control_rows_differ"], m
    assert m["step_host_reads"]["hidden"] == [] and m["step_host_reads"]["fenced"] >= 1, m


def test_the_kernels_compile_for_the_h200_without_a_device():
    """Triton's own compiler lowers every kernel (f32 and the three block families of matmul,
    embedding, RMSNorm, add_norm, attention over f32 and f16 KV) to an sm_90 cubin here: the
    interpreter alone would accept what the compiler rejects (it did: non-constexpr globals)."""
    from agentkv.hal.cuda.compile_check import compile_all

    sizes = compile_all(90)
    assert len(sizes) == 11 and all(size > 0 for size in sizes.values()), sizes


@pytest.mark.cuda
@pytest.mark.skipif(NO_DEVICE, reason="needs a CUDA device")
def test_cuda_ops_witnessed_on_the_device():
    from agentkv.witness.ops import run_ops

    rows = run_ops(lookup("cuda"), lookup("reference"))
    assert all(r.status == "PASS" for r in rows), [r for r in rows if r.status != "PASS"]


@pytest.mark.cuda
@pytest.mark.skipif(NO_DEVICE, reason="needs a CUDA device")
@pytest.mark.parametrize("model", MODELS)
def test_cuda_whole_model_witnessed_on_the_device(model):
    from agentkv.witness.cuda_ops import model_rows

    (row,) = model_rows(lookup("cuda"), lookup("reference"), models=(model,))
    if row.status == "SKIP":
        pytest.skip(row.note)
    assert row.status == "PASS", row


@pytest.mark.cuda
@pytest.mark.skipif(NO_DEVICE, reason="needs a CUDA device")
def test_a_decode_step_never_syncs_on_the_device(tmp_path):
    """torch's sync debug mode raises on any synchronising call inside the decode step's
    forward; the logits are read (the fence) after it."""
    from tests.hal.cuda_interp_model import PROMPT, _runner

    runner = _runner(tmp_path, lookup("cuda"))
    table = list(range(2))
    runner.run([Chunk(PROMPT[:4], 0, table, None)])
    ids, meta, rows = runner.build([Chunk(PROMPT[4:5], 4, table, "last")])
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.model.forward(ids, meta, runner.kv, rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.isfinite(runner.backend.read(logits)).all()
