"""The quant codec base class: block geometry, the registry by gguf type, and array framing.

A codec turns raw GGUF bytes into float32 and back, one *block* at a time but vectorised over
all blocks of a tensor at once. The array conventions are gguf-py's (`gguf.quants`):

    raw:   uint8 [*rows, num_blocks_per_row * type_size]     (bytes of one row, last)
    array: float32 [*rows, num_blocks_per_row * block_size]  (logical row, last)

Subclasses only implement `dequantize_blocks` (and optionally `quantize_blocks`) over a 2-D
`[num_blocks, type_size]` / `[num_blocks, block_size]` pair; this base does the framing, the
size checks and the chunking (a chunk keeps the temporaries cache-sized; it is a loop over
many thousands of blocks at a time, never one per block).

Bit-identity with gguf-py matters (a cache hit must not change an answer, and weights are
part of the answer), so each codec repeats gguf-py's float32 operations in the same order:
IEEE `*`, `+`, `-` round once each, so `out *= d; out += m` is `(d * q) + m` exactly.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from agentkv.formats.errors import QuantError

# Output elements per chunk: ~1 MiB of float32, so a chunk's temporaries stay in cache.
CHUNK_ELEMENTS = 1 << 18

_CODECS: dict[int, type[Codec]] = {}


def qtype_label(qtype: int) -> str:
    """`"Q4_K (12)"` for a known gguf type, `"unknown (99)"` otherwise; for error messages."""
    codec = _CODECS.get(qtype) if isinstance(qtype, int) else None
    if codec is not None:
        return f"{codec.qtype.name} ({int(qtype)})"
    try:
        return f"{GGMLQuantizationType(int(qtype)).name} ({int(qtype)})"
    except ValueError:
        return f"unknown ({qtype})"


def supported_labels(quantize: bool = False) -> str:
    """Comma-separated labels of the registered codecs (those that quantize, if asked)."""
    codecs = [c for c in _CODECS.values() if c.can_quantize or not quantize]
    return ", ".join(qtype_label(c.qtype) for c in sorted(codecs, key=lambda c: int(c.qtype)))


def get_codec(qtype: int) -> type[Codec]:
    """The codec registered for `qtype`; QuantError naming it and the supported ones if none."""
    try:
        return _CODECS[int(qtype)]
    except (KeyError, TypeError, ValueError):
        raise QuantError(f"quant type {qtype_label(qtype)} is not supported; supported: {supported_labels()}") from None


def registered() -> dict[int, type[Codec]]:
    """A copy of the registry: gguf type number -> codec class."""
    return dict(_CODECS)


def block_info(qtype: int) -> tuple[int, int]:
    """(block_size, type_size) of any gguf-known type: elements and bytes per block."""
    codec = _CODECS.get(qtype) if isinstance(qtype, int) else None
    if codec is not None:
        return codec.block_size, codec.type_size
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(int(qtype))]
    except (KeyError, TypeError, ValueError):
        raise QuantError(
            f"quant type {qtype_label(qtype)} has no known block size; "
            f"known: {', '.join(t.name for t in GGML_QUANT_SIZES)}"
        ) from None


def row_bytes(qtype: int, n_cols: int) -> int:
    """Bytes of one row of `n_cols` logical elements; QuantError unless whole blocks."""
    block_size, type_size = block_info(qtype)
    if n_cols < 0 or n_cols % block_size:
        raise QuantError(f"row length {n_cols} is not a multiple of the {qtype_label(qtype)} block size {block_size}")
    return n_cols // block_size * type_size


class Codec:
    """One GGML block format. Classes are never instantiated; all methods are classmethods.

    Subclass with `class Q8_0(Codec, qtype=GGMLQuantizationType.Q8_0)` to register.
    """

    qtype: ClassVar[GGMLQuantizationType]
    block_size: ClassVar[int]  # logical elements per block
    type_size: ClassVar[int]  # bytes per block
    can_quantize: ClassVar[bool] = False

    def __init_subclass__(cls, qtype: int | None = None, block: tuple[int, int] | None = None, **kwargs) -> None:
        """`block` (elements, bytes) registers a type gguf does not know (agentkv's own)."""
        super().__init_subclass__(**kwargs)
        if qtype is None:
            return
        cls.qtype = GGMLQuantizationType(qtype) if block is None else qtype
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[cls.qtype] if block is None else block
        overrides = cls.quantize_blocks.__func__ is not Codec.quantize_blocks.__func__
        cls.can_quantize = cls.__dict__.get("can_quantize", False) or overrides
        if int(qtype) in _CODECS:
            raise RuntimeError(f"codec for {qtype_label(qtype)} registered twice (bug)")
        _CODECS[int(qtype)] = cls

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        """Decode `blocks` uint8 [n, type_size] into `out` float32 [n, block_size] (mutated)."""
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """Encode float32 [n, block_size] into a new uint8 [n, type_size]."""
        raise NotImplementedError

    @classmethod
    def _chunk_blocks(cls) -> int:
        return max(1, CHUNK_ELEMENTS // cls.block_size)

    @classmethod
    def dequantize_array(cls, raw: np.ndarray) -> np.ndarray:
        """uint8 [*rows, n_bytes] (any dtype, read as bytes) -> new float32 [*rows, n_cols]."""
        data = as_row_bytes(raw, cls)
        n_bytes = data.shape[-1]
        num_blocks = data.size // cls.type_size
        out = np.empty((*data.shape[:-1], n_bytes // cls.type_size * cls.block_size), np.float32)
        blocks = data.reshape(num_blocks, cls.type_size)
        out_blocks = out.reshape(num_blocks, cls.block_size)
        step = cls._chunk_blocks()
        for start in range(0, num_blocks, step):
            cls.dequantize_blocks(blocks[start : start + step], out_blocks[start : start + step])
        return out

    @classmethod
    def quantize_array(cls, array: np.ndarray) -> np.ndarray:
        """float [*rows, n_cols] -> new uint8 [*rows, n_bytes]; rows must be whole blocks."""
        if not cls.can_quantize:
            raise QuantError(
                f"quantizing to {qtype_label(cls.qtype)} is not supported; "
                f"quantizable: {supported_labels(quantize=True)}"
            )
        array = np.asarray(array)
        if array.ndim == 0:
            raise QuantError(f"cannot quantize a 0-d array to {qtype_label(cls.qtype)}")
        n_bytes = row_bytes(cls.qtype, array.shape[-1])
        rows = np.ascontiguousarray(array, dtype=np.float32)
        num_blocks = rows.size // cls.block_size
        blocks = rows.reshape(num_blocks, cls.block_size)
        out = np.empty((num_blocks, cls.type_size), np.uint8)
        step = cls._chunk_blocks()
        for start in range(0, num_blocks, step):
            out[start : start + step] = cls.quantize_blocks(blocks[start : start + step])
        return out.reshape(*array.shape[:-1], n_bytes)


def as_row_bytes(raw: np.ndarray, codec: type[Codec]) -> np.ndarray:
    """`raw` viewed as uint8 with the row's bytes last (a copy only if not contiguous);
    QuantError unless it has a row axis of whole `codec` blocks."""
    raw = np.asarray(raw)
    if raw.ndim == 0:
        raise QuantError(f"raw {qtype_label(codec.qtype)} data must have a row axis, got 0-d")
    data = np.ascontiguousarray(raw).view(np.uint8)
    if data.shape[-1] % codec.type_size:
        raise QuantError(
            f"{data.shape[-1]} bytes per row is not a multiple of the {qtype_label(codec.qtype)} "
            f"type size {codec.type_size}"
        )
    return data


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 at byte `offset` of each block, widened: float32 [n, 1]."""
    return blocks[:, offset : offset + 2].view(np.float16).astype(np.float32)
