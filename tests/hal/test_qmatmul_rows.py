"""A row's matmul bits are the same for every batch size from 1 to 20 and past the
decode/prefill crossover: the register-decoded path (row groups of <= 8), its group splits
(9 -> 5 + 4, 17 -> 6 + 6 + 5) and the panel path (64 rows, the reference) all run one fma
order per output. Exact equality, with a split-k control that shows the check catches a
changed order."""

from __future__ import annotations

import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import load, row_bytes
from tests.hal.test_kernels import QTYPES, check_close, random_quant

pytest.importorskip("gguf")
try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

MAX_ROWS = 64  # the reference batch: past both builds' crossover (panel path)
BATCHES = [*range(1, 21), 33, 49]
# n: not a multiple of the column blocks (24), tiles (2, 3, 4) or thread chunks (12), and
# wide enough that two threads split it.
N, K_LEN = 131, 512


def first_variant_m(matmul, x: torch.Tensor) -> int | None:
    """The first m of BATCHES whose rows differ in any bit from the same rows computed with
    all len(x) rows, or None when every m agrees."""
    full = matmul(x)
    for m in BATCHES:
        if not torch.equal(matmul(x[:m].contiguous()), full[:m]):
            return m
    return None


def inputs(seed: int, k: int = K_LEN) -> torch.Tensor:
    return torch.randn(MAX_ROWS, k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", QTYPES)
def test_row_bits_same_for_every_m_up_to_20(name, threads, isa):
    w = torch.from_numpy(random_quant(name, N, K_LEN, seed=31))
    qtype = QTYPES[name]
    assert first_variant_m(lambda x: K.qmatmul(x, w, qtype, N, K_LEN), inputs(32)) is None


@pytest.mark.parametrize("k", [100, 576])
def test_f32_row_bits_same_for_every_m_up_to_20(k, threads, isa):
    """f32 weights (k padded to 32 when it is not a multiple) take the same driver."""
    w = torch.randn(N, k, generator=torch.Generator().manual_seed(k))
    assert first_variant_m(lambda x: K.matmul_f32(x, w), inputs(33, k)) is None


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q6_K"])
def test_row_bits_control_split_k_past_four_rows_is_caught(name, isa):
    """Control: the same check on a matmul that, from 5 rows on, sums two half-k products
    (another fma order, close but not equal) must fail: the 64-row reference is split, so
    already m = 1 differs."""
    qtype, half = QTYPES[name], K_LEN // 2
    w = torch.from_numpy(random_quant(name, N, K_LEN, seed=34))
    lo, hi = w[:, : row_bytes(qtype, half)].contiguous(), w[:, row_bytes(qtype, half) :].contiguous()

    def split_past_four(x: torch.Tensor) -> torch.Tensor:
        if len(x) <= 4:
            return K.qmatmul(x, w, qtype, N, K_LEN)
        left, right = x[:, :half].contiguous(), x[:, half:].contiguous()
        return K.qmatmul(left, lo, qtype, N, half) + K.qmatmul(right, hi, qtype, N, half)

    x = inputs(35)
    assert first_variant_m(split_past_four, x) == 1
    check_close(split_past_four(x), K.qmatmul(x, w, qtype, N, K_LEN).double().numpy())  # same values, other bits
