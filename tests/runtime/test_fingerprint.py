"""Everything that changes a KV bit is in the disk tier's fingerprint: the list in one place
(runtime/fingerprint.py) walked entry by entry, and the restart that used to be served KV
computed under another weights mode."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.cache.disk_fingerprint import fingerprint_for
from agentkv.cache.disk_tier import DiskTier
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.fingerprint import FINGERPRINT_PARTS, cpu_isa, library_versions
from agentkv.runtime.params import SamplingParams
from tests.models.helpers import tiny_hf_model, write_gguf
from tests.runtime.test_exactness import tokens

NS = ("tiny", None)


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("q4-fp")
    model = tiny_hf_model(folder / "hf", "qwen2", seed=5, vocab_size=257, max_position_embeddings=512)
    return str(write_gguf(model, folder / "tiny-q4_1.gguf", "qwen2", qtype="Q4_1", byte_vocab=True))


def disk_engine(model: str, directory, weights: str = "resident") -> Engine:
    cache = CacheConfig(num_blocks=64, dtype="f32", disk_dir=str(directory))
    engine = Engine(EngineConfig(model=model, weights=weights, cache=cache))
    engine.record_logits = True
    return engine


def first_row(engine: Engine, prompt: list[int], rid: str) -> tuple[int, np.ndarray]:
    engine.add_request(rid, prompt, SamplingParams(max_tokens=1, temperature=0.0))
    cached = 0
    while engine.has_unfinished():
        for out in engine.step():
            cached = out.cached_len
    return cached, engine.recorded.pop(rid)[0]


def test_every_entry_of_the_list_changes_the_fingerprint_and_refuses_the_old_files(tmp_path):
    parts = tuple((name, "f32" if name == "kv_dtype" else f"value-of-{name}") for name in FINGERPRINT_PARTS)

    class Spec:
        num_layers, num_kv_heads, head_dim, block_size = 1, 1, 2, 4

    kv = {b: bytes([b]) * (4 * 1 * 2 * 4 * 1 * 2) for b in range(4)}
    token_ids = [5, 6, 7, 8]
    original = DiskTier(tmp_path, fingerprint_for(parts, 4, Spec), 1 << 20, kv.__getitem__)
    original.offer(NS, token_ids, {0: 1})
    original.close()
    assert original.fetch(NS, token_ids, 0, 1) == [kv[1]]  # control: the same fingerprint is served
    digests = {original.fingerprint.digest}
    for i, (name, value) in enumerate(parts):
        changed = parts[:i] + ((name, value + "-changed"),) + parts[i + 1 :]
        if name == "kv_dtype":
            changed = parts[:i] + ((name, "f16"),) + parts[i + 1 :]
        tier = DiskTier(tmp_path, fingerprint_for(changed, 4, Spec), 1 << 20, kv.__getitem__)
        digests.add(tier.fingerprint.digest)
        assert tier.fetch(NS, token_ids, 0, 1) == [], name
        assert dict(tier.stats().ignored).get("fingerprint", 0) >= 1, name  # counted, not served
        tier.close()
    assert len(digests) == len(FINGERPRINT_PARTS) + 1


def test_the_libraries_and_the_cpu_are_read_as_they_are():
    versions = library_versions()
    assert versions["torch"].startswith("2.13.0") and ";" in versions["blas"] and ";" in versions["numpy"]
    assert "avx2" in cpu_isa().split()  # the kernels require it, so every machine here has it


def test_a_restart_in_another_weights_mode_never_gets_the_old_kv(q4_gguf, tmp_path):
    prompt = tokens(70, 8, 257)
    resident = disk_engine(q4_gguf, tmp_path)
    cold_resident = first_row(resident, prompt, "a")[1]
    resident.close()  # write-back: the prompt's full blocks are on disk now
    f32 = disk_engine(q4_gguf, tmp_path, weights="f32")
    cached, row = first_row(f32, prompt, "b")
    assert cached == 0 and f32.disk.stats().hit_blocks == 0
    assert dict(f32.disk.stats().ignored)["fingerprint"] >= 4  # the resident run's files: refused
    f32.close()
    again = disk_engine(q4_gguf, tmp_path)  # control: the same mode is served from disk
    cached, row = first_row(again, prompt, "c")
    assert cached == 64 and again.disk.stats().hit_blocks == 4
    assert np.array_equal(row, cold_resident)
    again.close()
