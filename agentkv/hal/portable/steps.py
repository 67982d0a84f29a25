"""Per-step index tensors of the torch backends, built once per step and shared by every layer
(each layer passes the same AttnMeta, so an identity check on it is the memo key)."""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np
import torch

from agentkv.hal.base import AttnMeta

_META_MEMO: list = [(None, None)]  # (meta, tensors), swapped whole so threads never mix halves


def kernel_meta(meta: AttnMeta):
    """Block tables, row -> sequence and row -> position as int32 tensors, once per step."""
    last_meta, last = _META_MEMO[0]
    if last_meta is meta:
        return last
    tables = padded_tables(meta.block_tables)
    row_seq = np.repeat(np.arange(len(meta.query_lens), dtype=np.int32), meta.query_lens)
    out = (torch.from_numpy(tables), torch.from_numpy(row_seq), torch.from_numpy(meta.positions.astype(np.int32)))
    _META_MEMO[0] = (meta, out)
    return out


def padded_tables(block_tables) -> np.ndarray:
    """The sequences' block tables as int32 `[num_seqs, width]`, 0-padded, without a Python
    loop over the sequences (an op's Python work must not grow with its batch: the ledger's
    row-loop fence, agentkv/witness/contract.py)."""
    lens = np.fromiter(map(len, block_tables), np.int64, len(block_tables))
    width = int(lens.max(initial=1))
    tables = np.zeros((len(block_tables), width), np.int32)
    tables[np.arange(width) < lens[:, None]] = np.fromiter(chain.from_iterable(block_tables), np.int32, int(lens.sum()))
    return tables


class StepRows(NamedTuple):
    positions: torch.Tensor  # int64 [n]
    slots: torch.Tensor  # int64 [n]
    max_pos: int


_ROWS_MEMO: list = [(None, None)]  # (meta, StepRows), swapped whole like _META_MEMO


def step_rows(meta: AttnMeta) -> StepRows:
    """Positions and slots as int64 tensors for the fused kernels, once per step (every layer
    passes the same meta)."""
    last_meta, last = _ROWS_MEMO[0]
    if last_meta is meta:
        return last
    pos = np.ascontiguousarray(meta.positions, dtype=np.int64)
    out = StepRows(torch.from_numpy(pos), slots_tensor(meta.slot_mapping, torch.device("cpu")), int(pos.max(initial=0)))
    _ROWS_MEMO[0] = (meta, out)
    return out


_SLOTS_MEMO: list = [(None, None)]  # (slot_mapping array, tensor)


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` without a host sync: on a CUDA device the copy goes through
    pinned memory with `non_blocking`, so the host never waits for the stream (a pageable
    copy does: torch's sync debug mode counts it). On the CPU the tensor may alias `array`."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def slots_tensor(slot_mapping, device) -> torch.Tensor:
    """slot_mapping as an int64 tensor on device, converted once per step: the memo holds the
    array itself, so an identity match is never a recycled id."""
    last_arr, last = _SLOTS_MEMO[0]
    if last_arr is slot_mapping and last.device == device:
        return last
    out = to_device(np.asarray(slot_mapping, dtype=np.int64), device)
    _SLOTS_MEMO[0] = (slot_mapping, out)
    return out
