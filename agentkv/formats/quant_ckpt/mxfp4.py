"""transformers' MXFP4 checkpoints (gpt-oss): `quant_method: mxfp4` expert pairs as GGUF MXFP4.

gpt-oss stores each layer's routed experts as two pairs of tensors,

    model.layers.{i}.mlp.experts.gate_up_proj_blocks  uint8 [E, 2F, D / 32, 16]  (+ _scales [E, 2F, D / 32])
    model.layers.{i}.mlp.experts.down_proj_blocks     uint8 [E, D, F / 32, 16]   (+ _scales [E, D, F / 32])

rows being output features; gate and up interleave in gate_up (gate rows even, up rows odd).
The reader presents them as llama.cpp's converter writes them: `experts.gate_proj.weight`,
`experts.up_proj.weight` and `experts.down_proj.weight`, each `[E, out, in]` in GGUF MXFP4
blocks (the codes and scale bytes kept, only the nibbles moved), so the experts stay MXFP4
and a family reads the same tensors from both formats. Everything else in such a checkpoint
is plain (bf16) and read as usual.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from agentkv.formats.quant_ckpt.scheme import QuantConfigError
from agentkv.formats.quants.mxfp4 import from_hf_blocks

BLOCKS, SCALES = "_blocks", "_scales"
# logical projection -> (the stored pair it comes from, which rows of it)
_SPLITS = {"gate_up_proj": (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2)))}


class MxPair(NamedTuple):
    """One logical MXFP4 weight: the HF names of its blocks and scales, and its rows there."""

    blocks: str
    scales: str
    rows: slice


def is_mxfp4(config: dict[str, Any]) -> bool:
    qc = config.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == "mxfp4"


def find_pairs(hf_names: list[str], where: str) -> dict[str, MxPair]:
    """The MXFP4 weights among `hf_names`, keyed by their logical HF name (`...down_proj.weight`);
    QuantConfigError naming a `_blocks` tensor whose `_scales` is missing (or the reverse)."""
    names = set(hf_names)
    pairs = {}
    for name in hf_names:
        if not name.endswith((BLOCKS, SCALES)):
            continue
        stem = name[: -len(BLOCKS)]
        other = stem + (SCALES if name.endswith(BLOCKS) else BLOCKS)
        if other not in names:
            raise QuantConfigError(f"{where}: tensor {name!r} has no {other!r} (MXFP4 needs both)")
        if name.endswith(SCALES):
            continue
        head, _, projection = stem.rpartition(".")
        for logical, rows in _SPLITS.get(projection, ((projection, slice(None)),)):
            pairs[f"{head}.{logical}.weight"] = MxPair(name, stem + SCALES, rows)
    return pairs


def load_pair(pair: MxPair, blocks: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """(GGUF MXFP4 rows uint8 [E, out, G * 17], the logical shape [E, out, G * 32]) of one
    weight; QuantError naming the blocks tensor for a bad shape or a NaN scale."""
    if blocks.ndim != 4:
        raise QuantConfigError(
            f"tensor {pair.blocks!r} has shape {list(blocks.shape)}, expected [experts, out, groups, 16]"
        )
    data = from_hf_blocks(blocks[:, pair.rows], scales[:, pair.rows], pair.blocks)
    return data, (*data.shape[:2], blocks.shape[2] * 32)
