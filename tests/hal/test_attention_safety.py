"""Memory safety of the attention kernel: scratch sized for each call whichever build ran
before on the same thread, and index checks that still catch every bad value when the
checks are skipped for indices already seen."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hal.conftest import ISAS, K
from tests.hal.test_attention_kernel import ATTN_TOL, paged_cache, reference, run

if K is None:
    pytest.skip("agentkv CPU kernels unavailable here", allow_module_level=True)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: its thread_local scratch serves every unit
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(ISAS != ["avx2", "avx512"], reason="needs both kernel builds")
def test_avx2_call_after_avx512_call_gets_big_enough_scratch(one_thread):
    # An AVX-512 unit over 960 keys leaves 4*960 floats and 976 offsets; an AVX2 unit over
    # 1280 keys needs 3*1280 floats (no larger) but 1296 offsets.
    before = K.isa()
    try:
        for isa, length in (("avx512", 960), ("avx2", 1280), ("avx512", 200), ("avx2", 1600)):
            K.override_isa_unchecked(isa)  # the test switches builds on purpose
            k, v, tables = paged_cache([length], 1, 64, 16, seed=length)
            rows = [(0, length - 1)]
            q = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(length))
            ours = run(q, k, v, tables, rows, 0.125).double().numpy()
            ref = reference(q, k, v, tables, rows, 0.125)
            assert np.abs(ours - ref).max() <= ATTN_TOL * v.abs().max().item(), (isa, length)
    finally:
        K.override_isa_unchecked(before)


def _case():
    k, v, tables = paged_cache([40, 20], 2, 16, 16, seed=1)
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(2))
    seq = torch.tensor([0, 0, 1], dtype=torch.int32)
    pos = torch.tensor([39, 10, 19], dtype=torch.int32)
    return q, k, v, tables, seq, pos


def test_index_checks_still_catch_changed_values_of_checked_tensors():
    q, k, v, tables, seq, pos = _case()
    good = K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0)
    assert torch.equal(K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0), good)
    saved = tables[0, 2].item()
    tables[0, 2] = k.shape[0]  # in place, same tensor object as the checked one
    with pytest.raises(RuntimeError, match=r"block_tables\[0\]\[2\]=.* out of range"):
        K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0)
    tables[0, 2] = saved
    pos.numpy()[0] = 48  # through numpy: torch's version counter does not see this write
    with pytest.raises(RuntimeError, match=r"row_pos\[0\]=48 out of range"):
        K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0)
    pos.numpy()[0] = 39
    assert torch.equal(K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0), good)


def test_index_checks_see_a_smaller_cache_with_the_same_indices():
    q, k, v, tables, seq, pos = _case()
    K.paged_attention(q, k, v, tables, seq, pos, 0.25, 0, 0.0)
    used = int(tables.max())
    small_k, small_v = k[:used].contiguous(), v[:used].contiguous()  # block `used` is gone
    with pytest.raises(RuntimeError, match="out of range"):
        K.paged_attention(q, small_k, small_v, tables, seq, pos, 0.25, 0, 0.0)
