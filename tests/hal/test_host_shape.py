"""Host-shape fences that hold for every backend: tensors are handles, never aliases of host
memory; quantized weights stay as the file's blocks (no full-RAM f32 copy) where resident."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.base import BackendUnavailable, Layout
from agentkv.hal.kernels import row_bytes
from agentkv.hal.registry import lookup

BACKENDS = ["reference", "cpu", "torch"]
Q8_0 = 8


def _backend(name):
    try:
        return lookup(name)
    except BackendUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", BACKENDS)
def test_upload_and_read_copy_host_memory(name):
    """Fails if upload or read hands out the caller's memory: an in-place op (add_norm may
    reuse h's storage) would write into an array the caller still owns, or a later host
    write would change a tensor already computed on."""
    be = _backend(name)
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = be.upload(host)
    host[:] = -1.0
    assert np.array_equal(be.read(t), np.arange(12, dtype=np.float32).reshape(3, 4))
    out = be.read(t)
    out[:] = 7.0
    assert np.array_equal(be.read(t), np.arange(12, dtype=np.float32).reshape(3, 4))
    h = np.ones((2, 4), np.float32)
    g = be.upload_weight("g", np.ones(4, np.float32), 0, (4,))
    be.add_norm(be.upload(h), be.upload(np.ones((2, 4), np.float32)), g, 1e-6)
    assert np.array_equal(h, np.ones((2, 4), np.float32))  # the control of the aliasing: h untouched


def test_cpu_keeps_the_files_blocks_without_a_copy(tmp_path):
    """Resident quantized weights are the memory-mapped file itself: no eager f32 copy, and
    not even a copy of the blocks."""
    cpu = _backend("cpu")
    n, k = 4, 64
    path = tmp_path / "w.bin"
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(n, row_bytes(Q8_0, k)), dtype=np.uint8)
    blocks.reshape(-1, 34)[:, :2] = np.full((n * k // 32, 1), 0.01, np.float16).view(np.uint8)
    blocks.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    w = cpu.upload_weight("w", mapped, Q8_0, (n, k))
    assert w.layout is Layout.GGUF_ROWS and np.shares_memory(w.raw.numpy(), mapped)
    f32 = cpu.upload_weight("w", mapped, Q8_0, (n, k), resident=False)  # the control: dequantized
    assert f32.layout is Layout.ROW_MAJOR_F32 and not np.shares_memory(f32.raw.numpy(), mapped)
