"""Three rows of the host-shape ledger (docs/design.md), fenced: every activation an op
hands back is f32; an op's Python work grows with its rows only where the backend declares
it (`Capabilities.row_loops`); every weight is held from load to exit, so a model whose
weights do not fit where the backend keeps them is refused before the first upload. Each
check runs on the registered CPU backends with a control that breaks it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.formats.resolve import open_model
from agentkv.hal.base import BackendUnavailable, Tensor
from agentkv.hal.portable.backend import TorchBackend
from agentkv.hal.registry import lookup
from agentkv.hal.residency import WeightsDoNotFit, check_weights_fit, held_bytes
from agentkv.witness.contract import OpWatch, row_growth
from tests.hal.cuda_interp_model import PROMPT, _runner, tiny_llama

BACKENDS = ["reference", "cpu", "torch"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ledger")
    tiny_llama(folder)
    return folder


def step(folder):
    """One step of the tiny llama in each config of `row_growth`, after a 2-token prefill of
    three sequences (so the decode rows attend to keys already stored). A backend's runner is
    loaded once and rewrites the same blocks each time."""

    runners = {}

    def run(backend, config: str):
        from agentkv.runtime.runner import Chunk

        runner = runners.get(id(backend)) or runners.setdefault(id(backend), _runner(folder, backend))
        runner.run([Chunk(PROMPT[:2], 0, [b], None) for b in (0, 4, 8)])
        chunks = {
            "1 row": [Chunk(PROMPT[2:3], 2, [0], "last")],
            "7 rows": [Chunk(PROMPT[2:9], 2, [0, 1, 2], "last")],
            "3 seqs": [Chunk(PROMPT[2 + i : 3 + i], 2, [b], "last") for i, b in enumerate((0, 4, 8))],
        }[config]
        return runner.run(chunks)

    return run


class HalfGlu(TorchBackend):
    """Control: hands its GLU back in f16 (as an f16-activation backend would, undeclared),
    and its matmul takes that."""

    def glu(self, x, kind):
        return Tensor(super().glu(x, kind).raw.half())

    def matmul(self, x, weight, bias=None):
        return super().matmul(Tensor(x.raw.float()), weight, bias)


class RowLoopGlu(TorchBackend):
    """Control: computes its GLU one row at a time in Python."""

    def glu(self, x, kind):
        fused = not isinstance(x, (list, tuple))

        def row(i):
            return Tensor(x.raw[i : i + 1]) if fused else [Tensor(p.raw[i : i + 1]) for p in x]

        n = (x if fused else x[0]).shape[0]
        return Tensor(torch.cat([super(RowLoopGlu, self).glu(row(i), kind).raw for i in range(n)]))


@pytest.mark.parametrize("name", BACKENDS)
def test_every_op_hands_back_f32(name, folder):
    backend = lookup(name)
    with OpWatch(backend) as watch:
        step(folder)(backend, "7 rows")
    assert watch.off_dtype == [] and watch.checked > 0 and sum(watch.calls.values()) > 0


def test_an_op_handing_back_f16_is_caught(folder):
    backend = HalfGlu("cpu")
    with OpWatch(backend) as watch:
        step(folder)(backend, "1 row")
    assert watch.off_dtype and set(watch.off_dtype) == {"glu -> float16"}, watch.off_dtype


@pytest.mark.parametrize("name", BACKENDS)
def test_python_work_grows_with_rows_only_where_declared(name, folder):
    """Calls inside each op for 1 row, a 7-row chunk and 3 decode rows (warm): the ops whose
    count moves are exactly the declared `row_loops` (so the declaration is not vacuous)."""
    backend = lookup(name)
    growth = row_growth(backend, step(folder))
    assert set(growth) == set(backend.capabilities.row_loops), growth


def test_an_undeclared_row_loop_is_caught(folder):
    backend = RowLoopGlu("cpu")
    growth = row_growth(backend, step(folder))
    assert "glu" in growth and growth["glu"][1] > growth["glu"][0], growth
    assert "glu" not in backend.capabilities.row_loops


@pytest.mark.parametrize("name", BACKENDS)
def test_weights_that_do_not_fit_are_refused_before_load(name, folder):
    source, backend = open_model(tiny_llama(folder)), lookup(name)
    needed = held_bytes(source, backend, resident=True)
    assert check_weights_fit(source, backend, True, available=needed) == needed  # the control: it fits
    with pytest.raises(WeightsDoNotFit, match=rf"tiny.gguf: backend '{name}' would hold .* GiB of weights"):
        check_weights_fit(source, backend, True, available=needed - 1)
    dequantized = held_bytes(source, backend, resident=False)
    if name == "cpu":  # mapped: the kept blocks are the file's pages; dequantizing copies
        assert needed < dequantized
    assert dequantized == sum(4 * np.prod(source.tensor(n).shape) for n in source.tensor_names())


def test_quantized_expert_banks_count_their_blocks(tmp_path):
    """A 3-D `ffn_*_exps` bank in a kept qtype is held in its blocks, one 2-D weight per
    expert, so on `cpu` (mapped) it counts no bytes of its own, not 4 bytes per weight
    (gpt-oss-20b's MXFP4 experts counted as f32 were 71 GiB and refused on 24 GiB)."""
    from tests.hal.cuda_interp_moe import tiny_moe

    try:
        backend = lookup("cpu")
    except BackendUnavailable as e:
        pytest.skip(f"cpu kernels unavailable: {e}")
    source, kept = open_model(tiny_moe(tmp_path)), backend.capabilities.resident_qtypes
    f32_bytes = {n: 4 * int(np.prod(source.tensor(n).shape)) for n in source.tensor_names()}
    banks = [n for n in f32_bytes if len(source.tensor(n).shape) == 3]
    assert len(banks) == 6 and all(source.tensor(n).qtype in kept for n in banks)  # Q8_0 and F16 banks
    mapped = [n for n in f32_bytes if len(source.tensor(n).shape) in (2, 3) and source.tensor(n).qtype in kept]
    held = held_bytes(source, backend, resident=True)
    assert held == sum(f32_bytes.values()) - sum(f32_bytes[n] for n in mapped)
    assert held <= sum(f32_bytes.values()) - sum(f32_bytes[n] for n in banks)  # no bank counted
