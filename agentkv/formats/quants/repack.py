"""Q4_K re-laid as plain 32-element groups (nibble, scale, offset) for backends that keep it.

A Q4_K super-block is eight 32-element sub-blocks, each `x = (d * sc) * q - (dmin * m)`.
Folding the two float16 super-scales into per-group float32 `scale = d * sc` and
`offset = dmin * m` keeps every value bit-identical: `scale * q - offset` is exactly the
float32 arithmetic `dequantize` does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from agentkv.formats.quants.base import as_row_bytes, f16_field
from agentkv.formats.quants.kquants import Q4_K, bit_planes, scale_min_k4

GROUP_SIZE = 32


class Group32(NamedTuple):
    """x[..., j] = scale[..., j // 32] * q[..., j] - offset[..., j // 32], in float32."""

    q: np.ndarray  # uint8 [*rows, n_cols], values 0..15
    scale: np.ndarray  # float32 [*rows, n_cols // 32]
    offset: np.ndarray  # float32 [*rows, n_cols // 32]


def repack_q4k_as_group32(raw: np.ndarray) -> Group32:
    """Split raw Q4_K uint8 [*rows, n_bytes] into new (q, scale, offset) arrays.

    Raises QuantError when a row is not whole 144-byte blocks.
    """
    data = as_row_bytes(raw, Q4_K)
    lead, n_cols = data.shape[:-1], data.shape[-1] // Q4_K.type_size * Q4_K.block_size
    blocks = data.reshape(-1, Q4_K.type_size)
    sc, mn = scale_min_k4(blocks[:, 4:16])
    scale = f16_field(blocks, 0) * sc  # [num_blocks, 8]
    offset = f16_field(blocks, 2) * mn
    q = bit_planes(blocks[:, 16:], 4, 32, 4)  # [num_blocks, 4, 2, 32] = 8 groups of 32
    groups = (*lead, n_cols // GROUP_SIZE)
    return Group32(q.reshape(*lead, n_cols), scale.reshape(groups), offset.reshape(groups))
