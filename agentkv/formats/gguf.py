"""GGUFSource: a memory-mapped GGUF file (gguf-py's GGUFReader) checked against its own size.

gguf-py trusts the file: a short header reads past the end of the memmap and fails with a bare
IndexError, a short tensor silently becomes a smaller array. `_CheckedReader` bounds every
read and checks every tensor's byte range before gguf-py slices it, so each failure is a
GGUFError that names the file and the tensor or key at fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from agentkv.formats.errors import GGUFError
from agentkv.formats.hparams import hparams_from_gguf
from agentkv.formats.source import HParams, ModelSource, TensorInfo

GGUF_MAGIC = b"GGUF"

# Exceptions gguf-py lets escape on malformed input; re-raised as GGUFError with the path.
_READER_ERRORS = (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError)


class _TensorSpan:
    """One tensor-info record: where its bytes should lie and how many there must be."""

    __slots__ = ("name", "qtype", "shape", "start", "num_bytes")

    def __init__(
        self, name: str, qtype: GGMLQuantizationType, shape: tuple[int, ...], start: int, num_bytes: int
    ) -> None:
        self.name, self.qtype, self.shape = name, qtype, shape
        self.start, self.num_bytes = start, num_bytes

    @property
    def end(self) -> int:
        return self.start + self.num_bytes

    def describe(self) -> str:
        return f"tensor {self.name!r} ({self.qtype.name} {list(self.shape)})"


class _CheckedReader(GGUFReader):
    """GGUFReader whose reads are bounded by the file size and whose tensors are validated.

    Speed: gguf-py parses a 262k-entry vocabulary one element at a time through np.memmap
    slices (tens of seconds for gemma3 on a busy machine). Header reads here slice a plain
    ndarray view of the same mapping, and arrays of scalars or strings are read in one pass:
    a scalar array becomes one part, each string one memoryview part. `contents()` returns
    the same values (the tests compare with an unmodified GGUFReader); field.data indices
    differ, so `contents(i)` on a packed scalar array is not supported — use contents()."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._plain: np.ndarray | None = None
        self._mapping_tensors = False  # tensor data keeps gguf-py's np.memmap slices
        super().__init__(path, "r")

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        dtype = np.dtype(dtype)
        end = int(offset) + dtype.itemsize * int(count)
        if end > len(self.data):
            raise GGUFError(
                f"{self._path}: truncated header: a read at byte {int(offset)} needs "
                f"{end} bytes, the file has {len(self.data)}"
            )
        if self._mapping_tensors:
            return super()._get(offset, dtype, count, override_order)
        if self._plain is None or self._plain.base is not self.data:
            self._plain = self.data.view(np.ndarray)
        arr = self._plain[int(offset) : end].view(dtype)
        return arr.view(arr.dtype.newbyteorder(override_order or self.byte_order))

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        count, offs = int(alen[0]), orig_offs + 12
        itype = GGUFValueType(int(raw_itype[0]))
        nptype = self.gguf_scalar_to_np.get(itype)
        if count and nptype is not None:
            values = self._get(offs, nptype, count)
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
        if count and itype == GGUFValueType.STRING:
            parts: list[Any] = [raw_itype, alen]
            offs = self._read_strings(offs, count, parts)
            return offs - orig_offs, parts, list(range(2, 2 + count)), [GGUFValueType.ARRAY, itype]
        return super()._get_field_parts(orig_offs, raw_type)

    def _read_strings(self, offs: int, count: int, parts: list[Any]) -> int:
        """Append `count` length-prefixed strings from `offs` as memoryviews; returns the end."""
        buf, size = memoryview(self.data), len(self.data)
        for _ in range(count):
            if offs + 8 > size:
                self._get(offs, np.uint64)  # raises the truncated-header GGUFError
            length = int.from_bytes(buf[offs : offs + 8], "little")
            if offs + 8 + length > size:
                self._get(offs + 8, np.uint8, length)
            parts.append(buf[offs + 8 : offs + 8 + length])
            offs += 8 + length
        return offs

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        spans = sorted((self._span(start_offs, field) for field in fields), key=lambda s: s.start)
        file_size = len(self.data)
        for span, after in zip(spans, [*spans[1:], None]):
            if span.end > file_size:
                raise GGUFError(
                    f"{self._path}: truncated file: {span.describe()} needs bytes "
                    f"{span.start}..{span.end}, the file has {file_size}"
                )
            if after is not None and span.end > after.start:
                raise GGUFError(
                    f"{self._path}: {span.describe()} needs {span.num_bytes} bytes for "
                    f"its shape and type, but {after.describe()} starts "
                    f"{after.start - span.start} bytes after it"
                )
        self._mapping_tensors = True
        super()._build_tensors(start_offs, fields)

    def _span(self, start_offs: int, field: Any) -> _TensorSpan:
        _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
        name = bytes(name_data).decode("utf-8", errors="replace")
        raw = int(raw_dtype[0])
        try:
            qtype = GGMLQuantizationType(raw)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError(f"{self._path}: tensor {name!r} has unknown quant type id {raw}") from None
        ne = [int(d) for d in dims]
        shape = tuple(reversed(ne))
        if ne and ne[0] % block_size:
            raise GGUFError(
                f"{self._path}: tensor {name!r} ({qtype.name} {list(shape)}): row length "
                f"{ne[0]} is not a multiple of the {qtype.name} block size {block_size}"
            )
        num_bytes = int(np.prod(ne, dtype=np.int64)) * type_size // block_size
        return _TensorSpan(name, qtype, shape, int(start_offs) + int(offset_tensor[0]), num_bytes)


def _check_magic(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(4)
    if len(head) < 4:
        raise GGUFError(f"{path}: truncated header: {len(head)} bytes, a GGUF file starts with 4 magic bytes")
    if head != GGUF_MAGIC:
        raise GGUFError(f"{path}: wrong magic {head!r}, expected {GGUF_MAGIC!r}")


def open_reader(path: str | Path) -> GGUFReader:
    """A validated, memory-mapped gguf-py reader; raises GGUFError naming the file and fault."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    _check_magic(path)
    try:
        return _CheckedReader(path)
    except GGUFError:
        raise
    except _READER_ERRORS as exc:
        raise GGUFError(f"{path}: cannot read GGUF: {type(exc).__name__}: {exc}") from exc


class GGUFSource(ModelSource):
    """A GGUF file. Opening reads the header and tensor table; tensor data stays memory-mapped.

    `metadata` holds every key (including gguf-py's `GGUF.version/tensor_count/kv_count`) as a
    plain Python value; tensor names are as stored (canonical GGUF names)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._reader = open_reader(self.path)
        try:
            self.metadata: dict[str, Any] = {k: f.contents() for k, f in self._reader.fields.items()}
        except _READER_ERRORS as exc:
            raise GGUFError(f"{self.path}: cannot decode metadata: {type(exc).__name__}: {exc}") from exc
        self._tensors: dict[str, TensorInfo] = {
            t.name: TensorInfo(t.name, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.tensor_type), t.data)
            for t in self._reader.tensors
        }
        self._hparams: HParams | None = None

    @property
    def hparams(self) -> HParams:
        """Parsed on first access; raises GGUFError naming a missing required key."""
        if self._hparams is None:
            self._hparams = hparams_from_gguf(self.metadata, self.path, self.tensor_names())
        return self._hparams

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None
