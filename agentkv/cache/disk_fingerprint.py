"""The fingerprint of KV bits that outlive a process: everything a block's bytes depend on.

Two engines whose fingerprints differ may compute different bits for the same tokens, so a
block written by one is never served to the other. The fingerprint covers:

    parts      the engine's named entries (runtime/fingerprint.py: FINGERPRINT_PARTS): the
               model's bytes (SHA-256 of every byte of the file, or of each file of a folder,
               computed once per path + size + mtime: `weights_digest`), the backend's
               identity, the dtypes, the weights mode, the libraries and the CPU's ISA
    KV layout  block size, layers, kv heads, head dim, dtype, and LAYOUT_VERSION

The cache namespace (tenant, adapter, model name) is not part of it: it salts the root of
each chain instead (`disk_hash.root_hash`), so namespaces never share a block either.

Pure Python: the caller passes the backend's identity as plain values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

LAYOUT_VERSION = 2  # bump when the file format or the block byte layout changes
DIGESTS_FILE = "weights-digests.json"  # next to the blocks: path|size|mtime_ns -> digest
_CHUNK = 1 << 22
log = logging.getLogger(__name__)


class Fingerprint(NamedTuple):
    parts: tuple[tuple[str, str], ...]  # (name, value): the engine's FINGERPRINT_PARTS
    block_size: int
    kv_shape: tuple[int, int, int]  # (num_layers, num_kv_heads, head_dim)
    kv_dtype: str
    layout_version: int = LAYOUT_VERSION
    kv_stores: int = 2  # vectors per token and layer: K and V, or 1 for a latent layout (MLA)

    @property
    def digest(self) -> str:
        """Hex SHA-256 over every field, in order (stable across processes and machines); a
        latent layout's one store is named, so its files never pass for a K/V layout's."""
        fields = [[list(part) for part in self.parts], self.block_size, list(self.kv_shape), self.kv_dtype]
        fields.append(self.layout_version)
        if self.kv_stores != 2:
            fields.append(["kv_stores", self.kv_stores])
        text = json.dumps(fields)
        return hashlib.sha256(text.encode()).hexdigest()


def _model_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path]


def _stamp(files: list[Path], root: Path) -> str:
    """The key a cached digest is valid for: each file's path, size and mtime in nanoseconds."""
    parts = [str(root.resolve())]
    for f in files:
        st = f.stat()
        parts.append(f"{f.relative_to(root) if f != root else f.name}|{st.st_size}|{st.st_mtime_ns}")
    return "\n".join(parts)


def hash_model_files(path: Path) -> str:
    """SHA-256 over every byte of the model (a folder: each file's relative name, size, bytes)."""
    path = Path(path)
    h = hashlib.sha256()
    for f in _model_files(path):
        name = str(f.relative_to(path)) if path.is_dir() else ""
        h.update(f"{name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def weights_digest(path: Path, cache_dir: Path) -> str:
    """The model's digest, read from `cache_dir/DIGESTS_FILE` when the path, sizes and mtimes
    still match, else computed (every byte) and recorded there. A stale or unreadable record
    is recomputed: the record only saves time, it is never trusted over a changed file."""
    path = Path(path)
    stamp = _stamp(_model_files(path), path)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    record = Path(cache_dir) / DIGESTS_FILE
    known: dict[str, str] = {}
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    digest = known.get(stamp)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    digest = hash_model_files(path)
    known[stamp] = digest
    tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(known))
        os.replace(tmp, record)
    except OSError as exc:  # the digest is still right, only not remembered
        log.warning("cannot record the weights digest in %s: %s", record, exc)
    return digest


def fingerprint_for(parts: tuple[tuple[str, str], ...], block_size: int, kv_spec: object) -> Fingerprint:
    """The fingerprint of an engine with fingerprint `parts` (its "kv_dtype" entry is the
    element type of the files) and a KV store shaped like `kv_spec` (a hal KVSpec;
    duck-typed so that cache/ imports no backend)."""
    shape = (kv_spec.num_layers, kv_spec.num_kv_heads, kv_spec.head_dim)  # type: ignore[attr-defined]
    stores = getattr(kv_spec, "num_stores", 2)
    return Fingerprint(tuple(parts), block_size, shape, dict(parts)["kv_dtype"], kv_stores=stores)
