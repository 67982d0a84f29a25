"""The fingerprint of KV bits that outlive a process: everything a block's bytes depend on.

Two engines whose fingerprints differ may compute different bits for the same tokens, so a
block written by one is never served to the other. The fingerprint covers:

    model      SHA-256 of every byte of the model file (a folder: each file, by name), so
               the tensor data and the hyperparameters read from the metadata (rope base,
               norm eps, ...) are both covered; computed once per (path, size, mtime)
    backend    its identity (name, device, ISA, kernel build) and its fingerprint (+ dtypes)
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

LAYOUT_VERSION = 1  # bump when the file format or the block byte layout changes
DIGESTS_FILE = "weights-digests.json"  # next to the blocks: path|size|mtime_ns -> digest
_CHUNK = 1 << 22
log = logging.getLogger(__name__)


class Fingerprint(NamedTuple):
    weights_digest: str
    backend_identity: tuple[str | None, ...]  # hal Identity as plain values
    backend_fingerprint: str
    block_size: int
    kv_shape: tuple[int, int, int]  # (num_layers, num_kv_heads, head_dim)
    kv_dtype: str
    layout_version: int = LAYOUT_VERSION

    @property
    def digest(self) -> str:
        """Hex SHA-256 over every field, in order (stable across processes and machines)."""
        text = json.dumps(
            [
                self.weights_digest,
                list(self.backend_identity),
                self.backend_fingerprint,
                self.block_size,
                list(self.kv_shape),
                self.kv_dtype,
                self.layout_version,
            ]
        )
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


def fingerprint_for(
    model_path: Path, cache_dir: Path, backend: object, block_size: int, kv_spec: object
) -> Fingerprint:
    """The fingerprint of `backend` (a hal Backend: its `identity`, `fingerprint`, `kv_dtype`)
    running the model at `model_path` with a KV store shaped like `kv_spec` (a hal KVSpec).
    Duck-typed so that cache/ imports no backend. Reads the model's bytes unless
    `cache_dir` already holds their digest for the same path, size and mtime."""
    identity = tuple(backend.identity)  # type: ignore[attr-defined]
    shape = (kv_spec.num_layers, kv_spec.num_kv_heads, kv_spec.head_dim)  # type: ignore[attr-defined]
    return Fingerprint(
        weights_digest(model_path, cache_dir), identity, backend.fingerprint, block_size, shape, backend.kv_dtype
    )  # type: ignore[attr-defined]
