"""The layout fence: every weight declares how its data is laid out, upload_weight declares
the truth, and an op handed a layout it cannot read raises naming the weight and the layout
instead of computing on bytes it misreads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable, Layout, LayoutError, Weight
from agentkv.hal.kernels import row_bytes
from agentkv.hal.registry import lookup

Q8_0 = 8
BACKENDS = ["reference", "cpu", "torch"]


def _backend(name):
    try:
        return lookup(name)
    except BackendUnavailable as e:
        pytest.skip(str(e))


def _q8_rows(n: int, k: int, seed: int) -> np.ndarray:
    """Q8_0 blocks `[n, row_bytes]`: an f16 scale then 32 int8 weights per block."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(-127, 128, size=(n * k // 32, 34)).astype(np.int8).view(np.uint8)
    blocks[:, :2] = np.full((len(blocks), 1), 0.01, np.float16).view(np.uint8)
    return blocks.reshape(n, row_bytes(Q8_0, k))


def _as_numpy(raw) -> np.ndarray:
    return raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)


@pytest.mark.parametrize("name", BACKENDS)
def test_upload_weight_declares_the_layout_it_holds(name):
    """Fails if a backend keeps data in one layout and declares another."""
    be = _backend(name)
    f32 = be.upload_weight("f", np.ones((4, 64), np.float32), 0, (4, 64))
    quant = be.upload_weight("q", _q8_rows(4, 64, seed=0), Q8_0, (4, 64))
    for w in (f32, quant):
        raw = _as_numpy(w.raw)
        if w.layout is Layout.ROW_MAJOR_F32:
            assert raw.dtype == np.float32 and raw.shape == w.shape and raw.flags.c_contiguous, w
        else:
            assert w.layout is Layout.GGUF_ROWS and w.qtype == Q8_0 in be.capabilities.resident_qtypes
            assert raw.dtype == np.uint8 and raw.shape == (4, row_bytes(Q8_0, 64)), w
        assert w.layout in be.capabilities.layouts
    assert (quant.layout is Layout.GGUF_ROWS) == (Q8_0 in be.capabilities.resident_qtypes)


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_ops_refuse_a_layout_they_cannot_read(name):
    """Quant blocks handed to an f32-only backend: numpy would happily multiply the bytes."""
    be, cpu = _backend(name), _backend("cpu")
    blocks = cpu.upload_weight("blk.0.ffn_down.weight", _q8_rows(4, 64, seed=1), Q8_0, (4, 64))
    assert blocks.layout is Layout.GGUF_ROWS
    x = be.upload(np.ones((2, 64), np.float32))
    with pytest.raises(LayoutError, match=r"weight 'blk.0.ffn_down.weight' has layout 'gguf blocks by row'"):
        be.matmul(x, blocks)
    with pytest.raises(LayoutError, match="'blk.0.ffn_down.weight'"):
        be.embedding(blocks, np.array([0, 1]))


def test_control_the_backend_that_reads_the_layout_computes_it():
    cpu, ref = _backend("cpu"), lookup("reference")
    data = _q8_rows(4, 64, seed=1)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    got = cpu.read(cpu.matmul(cpu.upload(x), cpu.upload_weight("w", data, Q8_0, (4, 64))))
    want = ref.read(ref.matmul(ref.upload(x), ref.upload_weight("w", data, Q8_0, (4, 64))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the same numbers, f32 rounding apart


def test_a_weight_cannot_declare_a_layout_its_qtype_contradicts():
    with pytest.raises(LayoutError, match="weight 'w': layout 'row-major f32' cannot hold qtype 8"):
        Weight(np.zeros((1, 34), np.uint8), (1, 32), Q8_0, "w", layout=Layout.ROW_MAJOR_F32)
    with pytest.raises(LayoutError, match="layout 'gguf blocks by row' cannot hold qtype 0"):
        Weight(np.zeros((1, 32), np.float32), (1, 32), 0, "w", layout=Layout.GGUF_ROWS)
    with pytest.raises(ValueError, match="'column-major'"):
        Weight(np.zeros((1, 32), np.float32), (1, 32), 0, "w", layout="column-major")
