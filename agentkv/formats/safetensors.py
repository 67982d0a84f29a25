"""SafetensorsSource: a HF model folder (config.json + one or sharded *.safetensors), GGUF names.

The safetensors header is parsed here (8-byte little-endian length, then JSON) and every
tensor is an `np.memmap` of its own byte range. safetensors' numpy loader would copy, and it
cannot return bf16 at all; a memmap keeps the ModelSource promise (mapped, never copied) and
lets bf16 travel as uint16 with qtype BF16. The header is checked against the file size so a
short or inconsistent file fails with a SafetensorsError naming the file and tensor.

          ┌ 8 bytes: n ┬ n bytes: JSON header ┬ data: tensor i at [data_offsets[0], [1]) ┐
  file:   │  <u64      │ {"name": {...}, ...}  │ ...............................          │
          └────────────┴──────────────────────┴─ starts at 8 + n ─────────────────────────┘
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, get_tensor_name_map

from agentkv.formats.errors import SafetensorsError
from agentkv.formats.hparams import HF_ARCH, hparams_from_config
from agentkv.formats.quant_ckpt import QuantModule, describe, find_modules, load_module, parse_scheme
from agentkv.formats.quant_ckpt import mxfp4 as mx
from agentkv.formats.source import HParams, ModelSource, TensorInfo

# safetensors dtype -> (numpy dtype as stored, ggml type of TensorInfo.qtype)
DTYPES: dict[str, tuple[np.dtype, GGMLQuantizationType]] = {
    "F32": (np.dtype("<f4"), GGMLQuantizationType.F32),
    "F16": (np.dtype("<f2"), GGMLQuantizationType.F16),
    "BF16": (np.dtype("<u2"), GGMLQuantizationType.BF16),
    "F64": (np.dtype("<f8"), GGMLQuantizationType.F64),
    "I8": (np.dtype("i1"), GGMLQuantizationType.I8),
    "I16": (np.dtype("<i2"), GGMLQuantizationType.I16),
    "I32": (np.dtype("<i4"), GGMLQuantizationType.I32),
    "I64": (np.dtype("<i8"), GGMLQuantizationType.I64),
    # float8 e4m3fn codes, read only as a part of a quantized module (quant_ckpt)
    "F8_E4M3": (np.dtype("u1"), GGMLQuantizationType.I8),
    # MXFP4 codes and E8M0 scales, read only as a part of an MXFP4 expert pair (quant_ckpt.mxfp4)
    "U8": (np.dtype("u1"), GGMLQuantizationType.I8),
}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class _Entry(NamedTuple):
    """Where one tensor's bytes lie; mapped lazily by `tensor()`."""

    file: Path
    hf_name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in `file`


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SafetensorsError(f"{path}: no {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{path}: cannot read {what}: {exc}") from exc
    if not isinstance(value, dict):
        raise SafetensorsError(f"{path}: {what} is not a JSON object")
    return value


def read_header(file: Path) -> tuple[dict[str, Any], int]:
    """(header dict without __metadata__, absolute offset of the data section)."""
    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{file}: truncated header: {size} bytes, need at least 8")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise SafetensorsError(
                f"{file}: truncated header: header length {header_len} runs past the end of the {size}-byte file"
            )
        raw = fh.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"{file}: header is not valid JSON: {exc}") from exc
    header.pop("__metadata__", None)
    return header, 8 + header_len


def _entry(file: Path, name: str, spec: Any, data_start: int, size: int) -> _Entry:
    """Validate one header record against its shape, dtype and the file size."""
    if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES:
        dtype = spec.get("dtype") if isinstance(spec, dict) else spec
        raise SafetensorsError(
            f"{file}: tensor {name!r} has unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})"
        )
    shape = tuple(int(d) for d in spec.get("shape", []))
    begin, end = (int(o) for o in spec.get("data_offsets", (0, 0)))
    expected = int(np.prod(shape, dtype=np.int64)) * DTYPES[spec["dtype"]][0].itemsize
    if end - begin != expected:
        raise SafetensorsError(
            f"{file}: tensor {name!r} ({spec['dtype']} {list(shape)}) needs "
            f"{expected} bytes, its data_offsets [{begin}, {end}] hold {end - begin}"
        )
    if data_start + end > size:
        raise SafetensorsError(
            f"{file}: truncated file: tensor {name!r} ends at byte {data_start + end}, the file has {size}"
        )
    return _Entry(file, name, spec["dtype"], shape, data_start + begin)


def _file_entries(file: Path) -> dict[str, _Entry]:
    header, data_start = read_header(file)
    size = file.stat().st_size
    return {name: _entry(file, name, spec, data_start, size) for name, spec in header.items()}


def _part_array(entry: _Entry) -> np.ndarray:
    """A quantized module's part as its values: bf16 (a scale, usually) widened to float32,
    exactly, since the unpackers read numbers and a bf16 memmap holds raw uint16 bits."""
    arr = _array(entry)
    if entry.dtype == "BF16":
        return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return arr


def _array(entry: _Entry) -> np.ndarray:
    """The tensor's bytes as a read-only memmap of its dtype (zeros for an empty tensor)."""
    dtype = DTYPES[entry.dtype][0]
    if 0 in entry.shape:
        return np.zeros(entry.shape, dtype=dtype)  # np.memmap cannot map zero bytes
    return np.memmap(entry.file, dtype=dtype, mode="r", offset=entry.start, shape=entry.shape or (1,)).reshape(
        entry.shape
    )


def _encoder_renames(raw: dict[str, _Entry]) -> dict[str, str]:
    """HF names of an encoder's task model -> the base model's, as llama.cpp's converter renames
    them: the `bert.` / `roberta.` prefix dropped, and a BERT sequence classifier's pooler and
    classifier made the `classifier.dense` (-> `cls`) and `classifier.out_proj` (-> `cls.output`)
    that XLM-RoBERTa's head already has, so both families share one head (dense + tanh + out)."""
    renames = {}
    for hf_name in raw:
        for prefix in ("bert.", "roberta."):
            if hf_name.startswith(prefix):
                renames[hf_name] = hf_name[len(prefix) :]
    classifier = any(n in raw for n in ("classifier.weight", "classifier.bias"))
    for hf_name in raw:
        base = renames.get(hf_name, hf_name)
        if classifier and base.startswith("pooler.dense."):
            renames[hf_name] = "classifier.dense." + base.removeprefix("pooler.dense.")
        elif base.startswith("classifier.") and base.count(".") == 1:
            renames[hf_name] = "classifier.out_proj." + base.removeprefix("classifier.")
    return renames


class SafetensorsSource(ModelSource):
    """A HF folder. `metadata` is config.json, plus tokenizer_config.json under
    "tokenizer_config" when present. Tensor names are GGUF names where gguf-py's TensorNameMap
    knows the HF name, else the HF name unchanged."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder)
        if not self.path.is_dir():
            raise SafetensorsError(f"{self.path}: no such model folder")
        self.metadata: dict[str, Any] = _read_json(self.path / "config.json", "config.json")
        tok_config = self.path / "tokenizer_config.json"
        if tok_config.is_file():
            self.metadata["tokenizer_config"] = _read_json(tok_config, "tokenizer_config.json")
        self._entries: dict[str, _Entry] = {}
        raw: dict[str, _Entry] = {}
        for file in self._shard_files():
            raw.update(_file_entries(file))
        self._mx_pairs: dict[str, mx.MxPair] = {}
        self.scheme = (
            None if mx.is_mxfp4(self.metadata) else parse_scheme(self.metadata, str(self.path / "config.json"))
        )
        self._modules: dict[str, QuantModule] = {}
        self._parts: dict[str, _Entry] = {}
        if self.scheme is not None:
            self._split_quant_parts(raw)
        elif mx.is_mxfp4(self.metadata):
            self._split_mxfp4_pairs(raw)
        self._add_names(raw)
        self._hparams: HParams | None = None

    def _split_quant_parts(self, raw: dict[str, _Entry]) -> None:
        """Move each quantized module's parts out of `raw`; its logical weight takes their place."""
        where = str(self.path / "config.json")
        for logical, module in find_modules(self.scheme, list(raw), where).items():
            for part in module.parts.values():
                self._parts[part] = raw.pop(part)
            first = self._parts[next(iter(module.parts.values()))]
            raw[logical] = first._replace(hf_name=logical)
            self._modules[logical] = module

    def _split_mxfp4_pairs(self, raw: dict[str, _Entry]) -> None:
        """Move each MXFP4 pair out of `raw`; its logical expert weights take their place."""
        self._mx_pairs = mx.find_pairs(list(raw), str(self.path))
        for part in {p for pair in self._mx_pairs.values() for p in (pair.blocks, pair.scales)}:
            self._parts[part] = raw.pop(part)
        for logical, pair in self._mx_pairs.items():
            raw[logical] = self._parts[pair.blocks]._replace(hf_name=logical)

    def _shard_files(self) -> list[Path]:
        index = self.path / INDEX_FILE
        if index.is_file():
            weight_map = _read_json(index, INDEX_FILE).get("weight_map")
            if not isinstance(weight_map, dict):
                raise SafetensorsError(f"{index}: no 'weight_map' object")
            files = [self.path / shard for shard in dict.fromkeys(weight_map.values())]
            for file in files:
                if not file.is_file():
                    raise SafetensorsError(f"{index}: references shard {file.name!r}, which is missing")
            return files
        single = self.path / SINGLE_FILE
        if not single.is_file():
            raise SafetensorsError(f"{self.path}: neither {SINGLE_FILE} nor {INDEX_FILE}")
        return [single]

    def _add_names(self, raw: dict[str, _Entry]) -> None:
        name_map = self._name_map()
        renames = _encoder_renames(raw)
        for hf_name, entry in raw.items():
            file = entry.file
            mapped = renames.get(hf_name, hf_name)
            name = name_map.get_name(mapped, try_suffixes=(".weight", ".bias")) if name_map else None
            name = name or hf_name
            if name in self._entries:
                raise SafetensorsError(
                    f"{file}: tensor {hf_name!r} maps to {name!r}, already provided by {self._entries[name].hf_name!r}"
                )
            self._entries[name] = entry

    def _name_map(self) -> Any:
        config = self.metadata.get("text_config") or self.metadata
        arch = HF_ARCH.get(config.get("model_type", self.metadata.get("model_type")))
        num_layers = config.get("num_hidden_layers")
        if arch is None or not isinstance(num_layers, int):
            return None
        arch_enum = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
        return get_tensor_name_map(arch_enum, num_layers)

    @property
    def hparams(self) -> HParams:
        """From config.json; tie_embeddings follows the tensors (no output.weight → tied)."""
        if self._hparams is None:
            hp = hparams_from_config(self.metadata, self.path)
            self._hparams = dataclasses.replace(hp, tie_embeddings="output.weight" not in self._entries)
        return self._hparams

    def tensor_names(self) -> list[str]:
        return list(self._entries)

    def has_tensor(self, name: str) -> bool:
        return name in self._entries

    def hf_name(self, name: str) -> str:
        """The name the tensor has in its safetensors file."""
        return self._lookup(name).hf_name

    def tensor(self, name: str) -> TensorInfo:
        """A plain tensor is memory-mapped; a quantized module's weight is unpacked from its
        parts and repacked into its resident blocks (a new array, about the parts' size)."""
        entry = self._lookup(name)
        pair = self._mx_pairs.get(entry.hf_name)
        if pair is not None:
            data, shape = mx.load_pair(pair, _array(self._parts[pair.blocks]), _array(self._parts[pair.scales]))
            return TensorInfo(name, shape, int(GGMLQuantizationType.MXFP4), data)
        module = self._modules.get(entry.hf_name)
        if module is not None:
            resident, shape = load_module(self.scheme, module, lambda part: _part_array(self._parts[part]))
            return TensorInfo(name, shape, resident.qtype, resident.data)
        if entry.dtype == "U8":  # uint8 has no plain meaning here (it would read as int8)
            raise SafetensorsError(
                f"{entry.file}: tensor {entry.hf_name!r} is U8, read only as the blocks or scales of MXFP4 experts"
            )
        return TensorInfo(name, entry.shape, int(DTYPES[entry.dtype][1]), _array(entry))

    def checkpoint_format(self, name: str) -> str | None:
        """How the checkpoint stores this tensor (`gptq int4 g128 sym`, ...); None when plain."""
        entry = self._lookup(name)
        if entry.hf_name in self._mx_pairs:
            return "mxfp4 blocks+scales"
        return describe(self.scheme) if entry.hf_name in self._modules else None

    def fallback_reason(self, name: str) -> str | None:
        """Why a quantized module's weight is f32 already in the source, None when it is not."""
        entry = self._lookup(name)
        module = self._modules.get(entry.hf_name)
        if module is None:
            return None
        resident, _ = load_module(self.scheme, module, lambda part: _part_array(self._parts[part]))
        return resident.fallback

    def _lookup(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor named {name!r}") from None
