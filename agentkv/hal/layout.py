"""Declared weight layouts: how a weight's resident data is laid out, and the check ops run."""

from __future__ import annotations

from enum import Enum
from typing import Any


class Layout(str, Enum):
    """How a weight's resident data is laid out. Declared by `upload_weight` and checked by
    the ops that read it, so no backend computes on a layout it merely assumes."""

    ROW_MAJOR_F32 = "row-major f32"  # float32, C order, the logical shape ([out, in] for a linear)
    GGUF_ROWS = "gguf blocks by row"  # uint8 [out, row_bytes]: each row the file's quant blocks


class LayoutError(ValueError):
    """A weight reached an op that cannot read its declared layout."""


def check_layout(weight: Any, accepted: frozenset[Layout], op: str) -> None:
    """Raise LayoutError naming the weight and its layout unless `op` reads that layout."""
    if weight.layout not in accepted:
        takes = ", ".join(sorted(repr(x.value) for x in accepted))
        raise LayoutError(f"{op}: weight {weight.name!r} has layout {weight.layout.value!r}; {op} reads {takes}")
