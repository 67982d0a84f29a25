"""The disk tier: full KV blocks kept in files beyond the RAM pool and beyond the process.

    RAM pool --evict (write-back) or insert (write-through)--> offer(): copy the block's bytes,
        queue them --writer thread--> temp file, rename to <key>.kvb   (never blocks a step)
    scheduler miss --> fetch(): keys of the next full blocks --> pending bytes or the file,
        verified (checksum, every header field) --> payloads the engine writes into fresh blocks

Files live in `DIR/kv-v<layout>-<fingerprint[:16]>/g-<group>/` (cache/disk_files.py: owner-
only, one folder per group, that is per tenant, so a tenant's cache is flushed whole); the
index is rebuilt at start from the file names and mtimes alone (no file is read), oldest
first. LRU: a hit bumps the file's mtime, so the order survives a restart; the oldest files
go when a write would pass the budget. A bad file (corrupt, truncated, another fingerprint or
layout, other tokens) is counted, deleted and never served. A write failure of any kind (full
disk, read-only directory, a bug) logs an error and leaves the tier read-only: the engine
runs on with RAM only, and `flush` still returns.

Thread use: `offer`, `fetch`, `flush`, `close` from the engine thread; the writer thread
only writes files and updates the index under the lock. Pure Python: the block bytes come
from the `read_block` hook the engine passes (backend.read_block on its KV store).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from agentkv.cache import disk_files
from agentkv.cache.block_pool import BlockId
from agentkv.cache.disk_fingerprint import LAYOUT_VERSION, Fingerprint
from agentkv.cache.disk_format import (
    IGNORE_REASONS,
    BadBlockFile,
    BlockHeader,
    block_hashes,
    decode_block,
    digest_of,
    encode_block,
    namespace_text,
    root_hash,
)
from agentkv.cache.radix import Node, RadixCache

log = logging.getLogger(__name__)
MAX_PENDING_BYTES = 256 << 20  # queued and not yet written; past it an offer is dropped
ELEMENT_BYTES = {"f32": 4, "f16": 2}  # KV element type (the backend's kv_dtype) -> bytes a block file holds per element
_STOP = object()
IGNORED_REASONS = (*IGNORE_REASONS, "stale_tmp", "unreadable")  # DiskStats.ignored's reasons
GroupOf = Callable[[Hashable], str]  # a namespace -> its group (tenant): the unit a flush deletes


def group_digest(group: str) -> str:
    """The hex name of a group's folder: a digest, so no tenant name is on disk."""
    return hashlib.sha256(b"agentkv-group\0" + group.encode()).hexdigest()


class DiskStats(NamedTuple):
    hit_blocks: int = 0  # blocks served from disk (or from the write queue)
    hit_tokens: int = 0  # their tokens (hit_blocks x block_size)
    loads: int = 0  # fetches that served at least one block
    written_blocks: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    ignored_files: int = 0  # bad files found (never served) and stale temporary files
    write_errors: int = 0  # failed writes, of any kind; the first one turns the tier read-only
    unwritten_at_close: int = 0  # blocks still queued when close() ran out of time
    dropped_writes: int = 0  # offers refused because the write queue was full or read-only
    num_files: int = 0
    used_bytes: int = 0
    read_only: bool = False
    ignored: tuple[tuple[str, int], ...] = ()  # ignored_files by reason (IGNORED_REASONS), sorted


class DiskTier:
    """KV blocks on disk under one fingerprint, LRU within `capacity_bytes`."""

    def __init__(
        self,
        directory: Path,
        fingerprint: Fingerprint,
        capacity_bytes: int,
        read_block: Callable[[BlockId], bytes],
        group_of: GroupOf = namespace_text,
    ) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes={capacity_bytes} must be >= 1")
        self.fingerprint = fingerprint
        self.fp_hex = fingerprint.digest
        self.block_size = fingerprint.block_size
        num_layers, kvh, hd = fingerprint.kv_shape
        stores = fingerprint.kv_stores  # K and V, or one latent row (MLA)
        self.shape = (num_layers, stores, self.block_size, kvh, hd)
        if fingerprint.kv_dtype not in ELEMENT_BYTES:
            raise ValueError(f"kv_dtype={fingerprint.kv_dtype!r} is not one of {', '.join(ELEMENT_BYTES)}")
        self.block_bytes = ELEMENT_BYTES[fingerprint.kv_dtype] * num_layers * stores * self.block_size * kvh * hd
        self.capacity_bytes = capacity_bytes
        self.dir = disk_files.make_dir(disk_files.tier_dir(directory, self.fp_hex))
        self._read_block, self._group_of = read_block, group_of
        self._lock = threading.Lock()
        self._index: OrderedDict[str, tuple[str, int]] = OrderedDict()  # key -> (group, bytes), oldest first
        self._pending: dict[str, tuple[BlockHeader, bytes, str]] = {}  # key -> (header, payload, group)
        self._pending_bytes = 0
        self._used = 0
        self._stats = dict(DiskStats()._asdict())
        self._ignored: dict[str, int] = {}
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        # offer drops a block when the queue is full (steps never wait); at shutdown it may wait
        # for the writer until this time.monotonic() deadline, and drops what comes after
        self.wait_until: float | None = None
        self._rebuild_index()
        self._writer = threading.Thread(target=self._write_loop, name="agentkv-kv-disk", daemon=True)
        self._writer.start()
        atexit.register(self.close)  # a normal exit flushes too (LLM, generate), not only SIGTERM

    # -- the index --------------------------------------------------------------------------
    def _rebuild_index(self) -> None:
        """From names and mtimes only; temporary files of dead writers are removed."""
        found = disk_files.scan(self.dir)
        self._index = found.index
        self._used = sum(size for _, size in found.index.values())
        for _ in range(found.num_stale_tmp):
            self._count_ignored("stale_tmp")
        for _ in range(found.num_other_fingerprint):
            self._count_ignored("fingerprint")

    def _count_ignored(self, reason: str) -> None:
        """One more file ignored for `reason` (caller holds the lock, or runs before the writer)."""
        self._stats["ignored_files"] += 1
        self._ignored[reason] = self._ignored.get(reason, 0) + 1

    def group(self, namespace: Hashable) -> str:
        """The hex name of `namespace`'s group folder (a digest: no tenant name on disk)."""
        return group_digest(str(self._group_of(namespace)))

    def _drop(self, key: str) -> None:
        """Forget and delete one file (caller holds the lock)."""
        entry = self._index.pop(key, None)
        if entry is not None:
            self._used -= entry[1]
            disk_files.unlink(disk_files.block_path(self.dir, entry[0], key))

    def _header(self, key: str, ns: str, token_ids: Sequence[int]) -> BlockHeader:
        ns_digest, tokens_digest = digest_of(ns, [int(t) for t in token_ids])
        kv_dtype = self.fingerprint.kv_dtype
        return BlockHeader(
            LAYOUT_VERSION, self.fp_hex, key, ns_digest, tokens_digest, self.shape, kv_dtype, self.block_bytes
        )

    def keys(self, namespace: str, token_ids: Sequence[int], num_blocks: int) -> list[str]:
        """Hex keys (file stems) of the first `num_blocks` blocks of `token_ids` in `namespace`
        (its JSON text, `namespace_text`)."""
        root = root_hash(self.fp_hex, namespace)
        return [h.hex() for h in block_hashes(root, token_ids, self.block_size, num_blocks)]

    # -- writing ------------------------------------------------------------------------------
    def offer(self, namespace: Hashable, token_ids: Sequence[int], blocks: Mapping[int, BlockId]) -> int:
        """Queue for writing each full block `j -> block id` of `blocks` whose KV holds the
        prefix `token_ids[:(j+1)*bs]` and that the disk does not have yet; the bytes are
        copied now (the block may be reused right after). Never waits for the disk. Returns
        how many blocks were queued."""
        ns = namespace_text(namespace)
        full = [j for j in sorted(blocks) if (j + 1) * self.block_size <= len(token_ids)]
        if ns is None or not full or self._closed:
            return 0
        keys = self.keys(ns, token_ids, full[-1] + 1)
        group = self.group(namespace)
        num_queued = 0
        for j in full:
            key = keys[j]
            with self._lock:
                if key in self._index or key in self._pending:
                    continue
                full_queue = self._pending_bytes + self.block_bytes > MAX_PENDING_BYTES
                if self._stats["read_only"] or (full_queue and self.wait_until is None):
                    self._stats["dropped_writes"] += 1
                    continue
            if full_queue and not self.flush(max(0.0, self.wait_until - time.monotonic())):
                with self._lock:  # shutting down and out of time: the rest is not written
                    self._stats["dropped_writes"] += 1
                continue
            payload = self._read_block(blocks[j])
            header = self._header(key, ns, token_ids[j * self.block_size : (j + 1) * self.block_size])
            with self._lock:
                self._pending[key] = (header, payload, group)
                self._pending_bytes += len(payload)
            self._queue.put(key)
            num_queued += 1
        return num_queued

    def _write_loop(self) -> None:
        while True:
            key = self._queue.get()
            try:
                if key is _STOP:
                    return
                self._write_one(key)
            except Exception as exc:  # noqa: BLE001 — any failure: read-only, never a dead writer
                self.fail(f"writing block {key[:16]}", exc)
            finally:
                self._queue.task_done()

    def fail(self, what: str, exc: BaseException) -> None:
        """A write failed: count it and turn the tier read-only (the first time, loudly)."""
        with self._lock:
            self._stats["write_errors"] += 1
            first = not self._stats["read_only"]
            self._stats["read_only"] = True
            for key in list(self._pending):  # nothing queued will be written now
                self._pending_bytes -= len(self._pending.pop(key)[1])
        if first:
            log.error("KV disk tier %s: %s failed (%r); read-only from now, continuing with RAM", self.dir, what, exc)

    def _write_one(self, key: str) -> None:
        with self._lock:
            item = self._pending.get(key)
            read_only = self._stats["read_only"]
        if item is None or read_only:
            return
        header, payload, group = item
        data = encode_block(header, payload)
        if self._make_room(len(data)):
            disk_files.write_file(disk_files.block_path(self.dir, group, key), data)
        with self._lock:
            self._pending.pop(key, None)
            self._pending_bytes -= len(payload)
            if len(data) <= self.capacity_bytes:
                self._index[key] = (group, len(data))
                self._used += len(data)
                self._stats["written_blocks"] += 1
                self._stats["bytes_written"] += len(data)

    def _make_room(self, num_bytes: int) -> bool:
        """Delete the least recently used files until `num_bytes` more fit the budget."""
        if num_bytes > self.capacity_bytes:
            return False
        with self._lock:
            while self._index and self._used + num_bytes > self.capacity_bytes:
                self._drop(next(iter(self._index)))
        return True

    # -- reading ------------------------------------------------------------------------------
    def fetch(self, namespace: Hashable, token_ids: Sequence[int], first_block: int, max_blocks: int) -> list[bytes]:
        """Payloads of blocks first_block, first_block+1, ... of the prefix `token_ids` as far
        as the disk (or the write queue) has them, verified, at most `max_blocks`. A bad file
        ends the run there: it is counted and deleted, and the caller computes the rest."""
        ns = namespace_text(namespace)
        if ns is None or max_blocks <= 0:
            return []
        keys = self.keys(ns, token_ids, first_block + max_blocks)
        payloads: list[bytes] = []
        for j in range(first_block, first_block + max_blocks):
            payload = self._read(keys[j], ns, token_ids[j * self.block_size : (j + 1) * self.block_size])
            if payload is None:
                break
            payloads.append(payload)
        with self._lock:
            self._stats["hit_blocks"] += len(payloads)
            self._stats["hit_tokens"] += len(payloads) * self.block_size
            self._stats["loads"] += bool(payloads)
        return payloads

    def _read(self, key: str, ns: str, token_ids: Sequence[int]) -> bytes | None:
        with self._lock:
            item = self._pending.get(key)
            entry = self._index.get(key)
            if entry is not None:
                self._index.move_to_end(key)
        if item is not None:
            return item[1]
        if entry is None:
            return None
        path = disk_files.block_path(self.dir, entry[0], key)
        try:
            data = path.read_bytes()
            payload = decode_block(data, self._header(key, ns, token_ids))
            os.utime(path)  # the LRU order of the next start
        except (OSError, BadBlockFile) as exc:
            log.warning("KV disk tier: ignoring %s: %s", path.name, exc)
            with self._lock:
                self._count_ignored(exc.reason if isinstance(exc, BadBlockFile) else "unreadable")
                self._drop(key)
            return None
        with self._lock:
            self._stats["bytes_read"] += len(data)
        return payload

    def evict_listener(self, cache: RadixCache) -> Callable[[Node], None]:
        """Write-back: `cache.on_evict` that offers the full blocks ending inside each node
        the cache drops (a block ending in its parent belongs to the parent)."""
        bs = self.block_size

        def on_evict(node: Node) -> None:
            namespace, token_ids = cache.path_of(node)
            first = node.start // bs
            ends = range(first, node.end // bs)
            self.offer(namespace, token_ids, {j: node.blocks[j - first] for j in ends if (j + 1) * bs > node.start})

        return on_evict

    # -- life -----------------------------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued block is written (or given up); False when `timeout_s`
        passed first. Returns however the writer fares: a failed write turns the tier
        read-only and drops the queue, it never leaves a waiter behind."""
        if timeout_s is None:
            self._queue.join()
            return True
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline or not self._writer.is_alive():
                return False
            time.sleep(0.01)
        return True

    def remove(self, group: str | None = None) -> int:
        """Delete the blocks of one group (the `group_of` value of a namespace, e.g. a tenant),
        or every block with None, from the queue, the index and the disk (mutates); returns
        how many files went."""
        digest = None if group is None else group_digest(group)
        self.flush()
        with self._lock:
            gone = [k for k, (g, _) in self._index.items() if digest is None or g == digest]
            for key in gone:
                self._used -= self._index.pop(key)[1]
        disk_files.remove_group(self.dir, digest)
        return len(gone)

    def close(self, timeout_s: float | None = None) -> int:
        """Flush (for at most `timeout_s`), then stop the writer (idempotent); returns how
        many blocks were left unwritten, which it also logs and counts."""
        self._closed = True
        atexit.unregister(self.close)
        if not self.flush(timeout_s):
            with self._lock:
                num_left = len(self._pending)
                self._stats["unwritten_at_close"] += num_left
                self._stats["read_only"] = True
            log.error(
                "KV disk tier %s: %d blocks not written at shutdown (%.0f s bound)", self.dir, num_left, timeout_s
            )
            return num_left
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        return 0

    def stats(self) -> DiskStats:
        with self._lock:
            ignored = tuple(sorted(self._ignored.items()))
            return DiskStats(
                **{**self._stats, "num_files": len(self._index), "used_bytes": self._used, "ignored": ignored}
            )
