"""The disk tier without a model: chained keys over explicit bytes, self-describing files,
an index rebuilt from names, LRU within the budget, bad files counted and never served, and a
write error that leaves the tier read-only. The KV store is a dict of block id -> bytes, the
shape of the `read_block` hook the engine passes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time

import pytest

from agentkv.cache import disk_files
from agentkv.cache.block_pool import BlockPool
from agentkv.cache.disk_fingerprint import Fingerprint
from agentkv.cache.disk_format import BlockHeader, block_hashes, encode_block, namespace_text, root_hash
from agentkv.cache.disk_tier import DiskTier
from agentkv.cache.radix import RadixCache

BS = 4
SHAPE = (2, 1, 3)  # layers, kv heads, head dim
BLOCK_BYTES = 4 * 2 * 2 * BS * 1 * 3
NS = ("model", None)


def fingerprint(weights: str = "w" * 64, isa: str = "avx512") -> Fingerprint:
    parts = (("model", weights), ("backend", "cpu"), ("isa", isa), ("kv_dtype", "f32"))
    return Fingerprint(parts, BS, SHAPE, "f32")


def store(num_blocks: int) -> dict[int, bytes]:
    return {b: bytes([b % 251]) * BLOCK_BYTES for b in range(num_blocks)}


def tier(path, kv, capacity=1 << 20, fp=None) -> DiskTier:
    return DiskTier(path, fp or fingerprint(), capacity, kv.__getitem__)


def decode_header(data: bytes) -> BlockHeader:
    """The header of a block file's bytes, read by hand (the format's layout, not its reader)."""
    (text_len,) = struct.unpack_from("<I", data, 4)
    fields = json.loads(data[8 : 8 + text_len])
    return BlockHeader(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def written(t: DiskTier, tokens, blocks) -> DiskTier:
    t.offer(NS, tokens, blocks)
    t.flush()
    return t


def test_keys_are_a_sha256_chain_over_explicit_bytes():
    fp = fingerprint().digest
    root = root_hash(fp, namespace_text(NS))
    assert root == hashlib.sha256(b"agentkv-kv\0" + bytes.fromhex(fp) + b'["model", null]').digest()
    tokens = list(range(10, 22))
    h0 = hashlib.sha256(root + struct.pack("<4i", 10, 11, 12, 13)).digest()
    h1 = hashlib.sha256(h0 + struct.pack("<4i", 14, 15, 16, 17)).digest()
    assert block_hashes(root, tokens, BS, 2) == [h0, h1]
    other_ns = root_hash(fp, namespace_text(("model", "tenant-b")))
    other_fp = root_hash(fingerprint(isa="avx2").digest, namespace_text(NS))
    assert len({root, other_ns, other_fp}) == 3
    assert namespace_text(("m", "prompt-logprobs", "r1")) is None
    assert namespace_text(("m", object())) is None


def test_fingerprint_digest_changes_with_every_field():
    base = fingerprint()
    variants = [
        base._replace(**{name: value})
        for name, value in (
            ("parts", (("model", "x" * 64),)),
            ("block_size", 8),
            ("kv_shape", (2, 1, 4)),
            ("kv_dtype", "bf16"),
            ("layout_version", 3),
            ("kv_stores", 1),  # a latent (MLA) layout's one row per token never passes for K and V
        )
    ]
    assert len({v.digest for v in [base, *variants]}) == len(variants) + 1


def test_written_blocks_survive_a_restart_from_the_index_alone(tmp_path):
    kv = store(8)
    tokens = list(range(100, 114))  # 3 full blocks and 2 tokens
    t = written(tier(tmp_path, kv), tokens, {0: 5, 1: 6, 2: 7})
    t.close()
    assert t.stats().written_blocks == 3
    again = tier(tmp_path, kv)
    assert again.stats().num_files == 3 and again.stats().bytes_read == 0
    assert again.fetch(NS, tokens, 0, 3) == [kv[5], kv[6], kv[7]]
    assert again.fetch(NS, tokens, 1, 2) == [kv[6], kv[7]]
    assert again.fetch(("model", "other"), tokens, 0, 3) == []
    changed = tokens[:5] + [999] + tokens[6:]  # block 1 differs: blocks 1 and 2 are other keys
    assert again.fetch(NS, changed, 0, 3) == [kv[5]]
    assert again.stats().hit_blocks == 6 and again.stats().hit_tokens == 6 * BS and again.stats().loads == 3


def test_file_is_self_describing(tmp_path):
    kv = store(2)
    t = written(tier(tmp_path, kv), [1, 2, 3, 4], {0: 1})
    (path,) = t.dir.glob("g-*/*.kvb")
    data = path.read_bytes()
    assert data[:4] == b"AKVB"
    (text_len,) = struct.unpack_from("<I", data, 4)
    header = json.loads(data[8 : 8 + text_len])
    assert header["tokens"] == hashlib.sha256(struct.pack("<4i", 1, 2, 3, 4)).hexdigest()
    assert header["namespace"] == hashlib.sha256(b'["model", null]').hexdigest()
    assert header["shape"] == [2, 2, BS, 1, 3]
    assert header["dtype"] == "f32" and header["layout_version"] == 2
    assert header["fingerprint"] == fingerprint().digest and path.stem == header["key"]
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()


@pytest.mark.parametrize(
    "damage, reason", [("flip", "corrupt"), ("truncate", "truncated"), ("foreign", "fingerprint"), ("old", "layout")]
)
def test_a_bad_file_is_counted_by_reason_deleted_and_never_served(tmp_path, damage, reason):
    kv = store(8)
    tokens = list(range(12))
    t = written(tier(tmp_path, kv), tokens, {0: 1, 1: 2, 2: 3})
    t.close()
    (victim,) = t.dir.glob(f"g-*/{t.keys(namespace_text(NS), tokens, 2)[1]}.kvb")
    data = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(data[:-40] + bytes([data[-40] ^ 1]) + data[-39:])
    elif damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    else:  # a file of another fingerprint put under this block's name
        other = written(tier(tmp_path / "other", kv, fp=fingerprint(isa="avx2")), tokens, {0: 1, 1: 4})
        other_key = other.keys(namespace_text(NS), tokens, 2)[1]
        shutil.copy(next(other.dir.glob(f"g-*/{other_key}.kvb")), victim)
    if damage == "old":  # an intact file of an older layout version under this block's name
        victim.write_bytes(encode_block(decode_header(data)._replace(layout_version=0), kv[2]))
    again = tier(tmp_path, kv)
    assert again.fetch(NS, tokens, 0, 3) == [kv[1]]
    assert again.stats().ignored_files == 1 and not victim.exists()
    assert again.stats().ignored == ((reason, 1),)
    assert again.fetch(NS, tokens, 0, 3) == [kv[1]]  # gone from the index: not counted twice
    assert again.stats().ignored_files == 1


def test_lru_within_the_budget_and_a_hit_bumps(tmp_path):
    kv = store(8)
    probe = written(tier(tmp_path / "probe", kv), [0] * BS, {0: 0})
    file_bytes = probe.stats().used_bytes
    t = tier(tmp_path / "lru", kv, capacity=3 * file_bytes)
    prompts = [[p] * BS for p in range(5)]
    for p in prompts[:3]:
        written(t, p, {0: p[0]})
    assert t.fetch(NS, prompts[0], 0, 1) == [kv[0]]  # 0 is now the most recent
    for p in prompts[3:]:
        written(t, p, {0: p[0]})
    stats = t.stats()
    assert stats.num_files == 3 and stats.used_bytes <= 3 * file_bytes
    assert [bool(t.fetch(NS, p, 0, 1)) for p in prompts] == [True, False, False, True, True]


def test_stale_temporary_files_are_removed_at_start(tmp_path):
    kv = store(2)
    t = written(tier(tmp_path, kv), [1, 2, 3, 4], {0: 1})
    t.close()
    (group,) = t.dir.glob("g-*")
    dead = _dead_pid()
    (group / f".deadbeef.{dead}.tmp").write_bytes(b"half a block")
    (group / f".cafef00d.{os.getpid()}.tmp").write_bytes(b"another live writer's block in flight")
    again = tier(tmp_path, kv)
    assert again.stats().ignored_files == 1 and again.stats().num_files == 1
    assert again.stats().ignored == (("stale_tmp", 1),)
    assert [p.name for p in again.dir.glob("g-*/*.tmp")] == [f".cafef00d.{os.getpid()}.tmp"]


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_write_error_leaves_the_tier_read_only(tmp_path, caplog):
    kv = store(4)
    t = tier(tmp_path, kv)
    shutil.rmtree(t.dir)
    t.dir.write_bytes(b"not a directory")  # every write now fails, as on a full disk
    assert t.offer(NS, [1, 2, 3, 4], {0: 1}) == 1
    t.flush()
    assert t.stats().write_errors == 1 and t.stats().read_only
    assert "read-only from now" in caplog.text
    assert t.offer(NS, [5, 6, 7, 8], {0: 2}) == 0 and t.stats().dropped_writes == 1
    assert t.fetch(NS, [1, 2, 3, 4], 0, 1) == []


def test_write_back_offers_the_full_blocks_of_each_evicted_node(tmp_path):
    kv = store(8)
    pool = BlockPool(8)
    cache = RadixCache(pool, BS)
    t = tier(tmp_path, kv)
    cache.on_evict = t.evict_listener(cache)
    tokens = list(range(10))  # blocks 0, 1 full, block 2 partial (never written)
    table = pool.allocate(3)
    cache.insert(NS, tokens, table)
    cache.insert(NS, tokens[:6] + [77, 78, 79], table[:1] + pool.allocate(2))  # a sibling
    pool.free(table)
    assert cache.evict(8) > 0
    t.flush()
    assert t.stats().written_blocks == 3  # [0..4), [4..8) and the sibling's [4..8)
    assert t.fetch(NS, tokens, 0, 2) == [kv[table[0]], kv[table[1]]]


def test_a_writer_exception_of_any_kind_leaves_the_tier_read_only_and_flush_returning(tmp_path, monkeypatch, caplog):
    kv = store(4)
    t = tier(tmp_path, kv)

    def broken(*args):
        raise ValueError("encode_block bug")

    monkeypatch.setattr("agentkv.cache.disk_tier.encode_block", broken)
    assert t.offer(NS, list(range(8)), {0: 1, 1: 2}) == 2
    done = threading.Event()
    threading.Thread(target=lambda: (t.flush(), done.set()), daemon=True).start()
    assert done.wait(10), "flush() never returned after the writer failed"
    stats = t.stats()
    assert stats.read_only and stats.write_errors == 1 and "encode_block bug" in caplog.text
    assert t.offer(NS, [9, 9, 9, 9], {0: 3}) == 0 and t.stats().dropped_writes == 1
    assert t.close() == 0  # the writer thread is still alive to be stopped


def test_close_is_bounded_and_reports_what_it_could_not_write(tmp_path, monkeypatch, caplog):
    kv = store(8)
    t = tier(tmp_path, kv)
    real = disk_files.write_file

    def slow(path, data):
        time.sleep(0.5)
        real(path, data)

    monkeypatch.setattr(disk_files, "write_file", slow)
    assert t.offer(NS, list(range(4 * 6)), {j: j for j in range(6)}) == 6
    t0 = time.monotonic()
    left = t.close(timeout_s=0.2)
    assert time.monotonic() - t0 < 2 and left >= 4
    assert t.stats().unwritten_at_close == left and "not written at shutdown" in caplog.text


def test_only_the_owner_can_read_the_files_and_a_tenant_group_is_flushed_whole(tmp_path):
    kv = store(8)
    t = DiskTier(tmp_path, fingerprint(), 1 << 20, kv.__getitem__, lambda ns: ns[1] or "shared")
    t.offer(("model", "team-a"), [1, 2, 3, 4], {0: 1})
    t.offer(("model", "team-b"), [1, 2, 3, 4], {0: 2})
    t.flush()
    files = sorted(t.dir.glob("g-*/*.kvb"))
    assert len(files) == 2 and len({f.parent for f in files}) == 2
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in (t.dir, *[f.parent for f in files])} == {0o700}
    assert all(b"team-a" not in f.read_bytes() and b"team-b" not in f.read_bytes() for f in files)
    assert t.remove("team-a") == 1
    assert t.fetch(("model", "team-a"), [1, 2, 3, 4], 0, 1) == []
    assert t.fetch(("model", "team-b"), [1, 2, 3, 4], 0, 1) == [kv[2]]  # the other tenant's stays
    assert t.remove(None) == 1 and not list(t.dir.glob("g-*/*.kvb"))


def test_cluster_workers_get_their_own_tier_folder_and_budget_share():
    from agentkv.commands.cluster import own_tier

    args = ("--kv-cache-dir", "/data/kv", "--kv-disk-size", "1000", "--max-num-seqs", "4")
    assert own_tier(args, 0, 2) == [
        "--kv-cache-dir",
        "/data/kv/worker-0",
        "--kv-disk-size",
        "500",
        "--max-num-seqs",
        "4",
    ]
    assert own_tier(args, 1, 2)[1] == "/data/kv/worker-1"
    assert own_tier(("--kv-cache-dir", "/d"), 1, 4)[-2:] == ["--kv-disk-size", str((16 << 30) // 4)]
    assert own_tier(("--max-num-seqs", "4"), 1, 2) == ["--max-num-seqs", "4"]


WRITER = """
import sys
from tests.cache.test_disk_tier import NS, fingerprint, store, tier
from pathlib import Path
kv = store(8)
t = tier(Path(sys.argv[1]), kv)
print("ready", flush=True)
for i in range(300):
    t.offer(NS, [1000 + i] * 4, {0: i % 8})
t.flush()
print(t.stats().write_errors, t.stats().written_blocks, flush=True)
"""


def test_two_processes_on_one_folder_never_delete_each_others_writes(tmp_path):
    """A second engine starting on a folder another one is writing to (what a restarting
    cluster worker did) leaves the other's temporary files alone: none of its writes fails."""
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(30):  # restarts while the other writes
            tier(tmp_path, store(1)).close()
        errors, written = map(int, child.stdout.readline().split())
    finally:
        child.wait(timeout=60)
    assert (errors, written) == (0, 300)
