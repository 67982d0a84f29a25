"""The model part of the disk tier's fingerprint: a digest of every byte of the model, computed
once per path, size and mtime and remembered next to the cache, never trusted over a change."""

from __future__ import annotations

import hashlib
import json
import os

from agentkv.cache.disk_fingerprint import DIGESTS_FILE, hash_model_files, weights_digest


def test_digest_covers_every_byte_and_is_remembered(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    cache = tmp_path / "cache"
    first = weights_digest(model, cache)
    expected = hashlib.sha256(f"\0{model.stat().st_size}\0".encode() + model.read_bytes()).hexdigest()
    assert first == expected == hash_model_files(model)
    record = json.loads((cache / DIGESTS_FILE).read_text())
    assert list(record.values()) == [first]
    # The record is what answers now: a planted value for the same stamp is returned as is.
    (cache / DIGESTS_FILE).write_text(json.dumps({k: "a" * 64 for k in record}))
    assert weights_digest(model, cache) == "a" * 64
    # One byte changed (same size, mtime moved on): a new stamp, so the bytes are hashed again.
    data = bytearray(model.read_bytes())
    data[100] ^= 1
    model.write_bytes(bytes(data))
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    changed = weights_digest(model, cache)
    assert changed not in (first, "a" * 64) and changed == hash_model_files(model)


def test_a_folder_digest_covers_each_file_by_name(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"rope_theta": 10000}')
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    first = hash_model_files(folder)
    (folder / "config.json").write_text('{"rope_theta": 10001}')
    assert hash_model_files(folder) != first
