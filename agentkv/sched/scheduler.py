"""Continuous batching: decodes first, then chunked prefills under a token budget,
admission through the prefix cache, eviction then preemption when KV blocks run short."""

from __future__ import annotations

import logging
from collections import deque

from agentkv.cache import BlockId, BlockPool, MatchResult, Node, RadixCache, common_prefix_len
from agentkv.cache.disk_tier import DiskTier
from agentkv.cache.snapshots import Snapshots, resume_point
from agentkv.sched.config import CacheView, SchedulerConfig
from agentkv.sched.integrity import check_scheduler
from agentkv.sched.plan import ScheduledChunk, SchedulerOutput, _Step
from agentkv.sched.sequence import SeqId, SeqStatus, Sequence
from agentkv.sched.speculation import DraftBlocks

log = logging.getLogger(__name__)


class Scheduler:
    """Decides, step by step, which tokens of which sequences to compute.

    Protocol per step: `schedule()`, the runner computes the chunks, `on_tokens(sampled)`;
    between steps the caller may `add`, `finish` and `abort`. Deterministic: no wall time,
    no hashing of unordered sets.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        pool: BlockPool,
        cache: RadixCache | None,
        view: CacheView,
        disk: DiskTier | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        """`snapshots`: a hybrid model's, whose hits are used up to the deepest block end
        holding a recurrent-state snapshot (cache/snapshots.py); None: token-exact hits."""
        if cache is not None and cache.block_size != view.block_size:
            raise ValueError(
                f"cache block_size={cache.block_size} differs from the view's block_size={view.block_size}"
            )
        if view.enable_prefix_cache and cache is None:
            raise ValueError("enable_prefix_cache=True needs a RadixCache")
        self.config = config
        self.block_size = view.block_size
        self.pool = pool
        self.cache = cache if view.enable_prefix_cache else None
        self.disk = disk if self.cache is not None else None  # serves full blocks past a RAM hit
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in arrival order
        self._seqs: dict[SeqId, Sequence] = {}
        self._locks: dict[SeqId, Node] = {}
        self._pinned: list[BlockId] = []  # copy sources kept alive until the step ran
        self._last: SchedulerOutput | None = None
        self._num_arrivals = 0
        self.preemptions = 0
        self.drafts = DraftBlocks(pool, self.block_size)  # speculation's blocks
        self.snapshots = snapshots

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS). Raises ValueError for one that can never fit."""
        if not seq.prompt_ids:
            raise ValueError(f"seq {seq.seq_id}: empty prompt")
        if seq.max_tokens < 1:
            raise ValueError(f"seq {seq.seq_id}: max_tokens={seq.max_tokens} must be >= 1")
        needed = self._num_blocks(len(seq.prompt_ids) + seq.max_tokens)
        if needed > self.pool.num_blocks:
            raise ValueError(
                f"seq {seq.seq_id}: prompt + max_tokens needs {needed} KV blocks, the pool has {self.pool.num_blocks}"
            )
        if seq.seq_id in self._seqs:
            raise ValueError(f"seq {seq.seq_id} already added")
        seq.arrival = self._num_arrivals
        self._num_arrivals += 1
        seq.status = SeqStatus.WAITING
        self._seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        """Plan one step (mutates: admits, allocates, may evict and preempt)."""
        step = _Step(self.config.max_num_batched_tokens)
        for seq in list(self.running):
            if step.budget_left == 0:
                break
            if seq.status is SeqStatus.RUNNING and seq.is_decoding:
                draft = self.drafts.take_draft(seq, step.budget_left) if seq.draft_ids else ()
                if draft:
                    step.chunks[seq.seq_id] = ScheduledChunk(seq, seq.num_computed, 1 + len(draft), True, draft)
                else:
                    self._extend(seq, 1, step)
        for seq in self.running:
            seq.draft_ids = []  # a draft is for this step only
        for seq in list(self.running):
            num_tokens = min(seq.num_remaining, step.budget_left, self.config.max_chunk_len)
            if num_tokens == 0:
                break
            if seq.status is SeqStatus.RUNNING and not seq.is_decoding:
                self._extend(seq, num_tokens, step)
        self._admit(step)
        self._last = SchedulerOutput(list(step.chunks.values()), step.copies, step.preempted, step.loads)
        return self._last

    def _extend(self, seq: Sequence, num_tokens: int, step: _Step) -> None:
        """Give a running sequence blocks for `num_tokens` more and schedule them; when the
        pool is short, evict from the cache, then preempt the youngest running sequence
        (possibly `seq` itself, which then waits)."""
        needed = self._num_blocks(seq.num_computed + num_tokens) - len(seq.block_table)
        while needed > 0:
            blocks = self._allocate(needed)
            if blocks is not None:
                seq.block_table.extend(blocks)
                break
            victim = max(self.running, key=lambda s: s.arrival)
            if victim is seq and len(self.running) == 1 and (self._unlock(seq) or self._unpin_all(seq)):
                # Alone, its own lock is what still pins blocks: the path's interior nodes
                # keep boundary blocks its table has copies of; or prefix pins hold them.
                # Drop the lock (then the pins) and evict again.
                continue
            self._preempt(victim, step)
            if victim is seq:
                return
        step.add(seq, num_tokens)

    def _allocate(self, num_blocks: int) -> list[BlockId] | None:
        blocks = self.pool.allocate(num_blocks)
        if blocks is None and self.cache is not None:
            self.cache.evict(num_blocks - self.pool.num_free)
            blocks = self.pool.allocate(num_blocks)
        return blocks

    def _preempt(self, seq: Sequence, step: _Step) -> None:
        """Release a running sequence's blocks (its computed KV goes to the cache first, so
        resuming re-matches it) and put it at the front of the queue to recompute."""
        self._release(seq, insert=True)
        self.running.remove(seq)
        step.chunks.pop(seq.seq_id, None)
        step.preempted.append(seq.seq_id)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)  # the youngest goes first, so older ones end up ahead
        self.preemptions += 1

    def _release(self, seq: Sequence, insert: bool) -> None:
        if insert and self.cache is not None and seq.num_computed > 0:
            self.cache.insert(seq.namespace, seq.ids(0, seq.num_computed), seq.block_table)
        if self.snapshots is not None and seq.num_computed > 0:  # a hybrid's running state goes
            self.snapshots.release_running(seq.block_table, seq.num_computed)
        self._unlock(seq)
        self.pool.free(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0

    def _unlock(self, seq: Sequence) -> bool:
        """Release `seq`'s lock on the tree, if it holds one."""
        node = self._locks.pop(seq.seq_id, None)
        if node is None:
            return False
        assert self.cache is not None
        self.cache.unlock(node)
        return True

    def _admit(self, step: _Step) -> None:
        """Start waiting sequences FCFS while budget, batch width and blocks allow. A
        sequence preempted this step, or one that cannot get its blocks, stops admission
        (nobody overtakes it); one waiting for an in-flight prefix lets others pass."""
        for seq in list(self.waiting):
            if step.budget_left == 0 or len(self.running) >= self.config.max_num_seqs:
                return
            if seq.seq_id in step.preempted:
                return
            if self._waits_for_inflight(seq, step):
                continue
            if not self._start(seq, step):
                return

    def _waits_for_inflight(self, seq: Sequence, step: _Step) -> bool:
        """True when a running sequence is still prefilling a longer prefix of `seq` than
        the cache holds now: `seq` waits for its progressive insertion instead of computing
        the same KV twice, unless waiting would leave the batch empty."""
        if self.cache is None or not step.chunks:
            return False
        limit = seq.num_tokens - 1
        match = self.cache.match(seq.namespace, seq.all_ids, limit, record=False)
        cached_len = resume_point(match, self.snapshots, self.block_size).cached_len
        for other in self.running:
            if other.namespace != seq.namespace or other.is_decoding:
                continue
            shared_len = common_prefix_len(seq.ids(0, limit), other.all_ids)
            if shared_len > cached_len and other.num_computed < shared_len:
                return True
        return False

    def _start(self, seq: Sequence, step: _Step) -> bool:
        """Admit `seq` if its first chunk's blocks can be had, evicting but never
        preempting. With nothing running nobody will ever free a block, so when even the
        locked matched path does not leave room, drop the cache and start cold; when prefix
        pins are what still holds the pool, they are released (a pin is a hint: a request
        that fits the pool always runs). A retry happens only when something was freed."""
        if self._try_start(seq, step):
            return True
        if self.running or self.cache is None:
            return False
        if self.cache.evict(self.pool.num_blocks) and self._try_start(seq, step):
            return True
        if not self._unpin_all(seq):
            return False
        self.cache.evict(self.pool.num_blocks)
        return self._try_start(seq, step)

    def _unpin_all(self, seq: Sequence) -> bool:
        """Release every prefix pin, because `seq`, alone, cannot get its blocks otherwise (a
        pin is a hint: a request that fits the pool always runs). False when none was held."""
        if self.cache is None or not self.cache.unpin_expired(everything=True):
            return False
        log.warning("prefix pins held the KV blocks seq %d needs to run: released", seq.seq_id)
        return True

    def _try_start(self, seq: Sequence, step: _Step) -> bool:
        """Match the cache, lock the path, build `seq`'s block table (shared full blocks, a
        copied partial one) and schedule its first chunk. False, with nothing taken, when
        the blocks cannot be had even after evicting unlocked entries."""
        match = self._lock_prefix(seq)
        loads = self._disk_loads(seq, match)
        while loads and self.snapshots is not None and not self.snapshots.payload_has(loads[-1]):
            loads.pop()  # a hybrid resumes from the deepest loaded snapshot
        num_full = match.cached_len // self.block_size
        cached_len = (num_full + len(loads)) * self.block_size if loads else match.cached_len
        num_tokens = min(seq.num_tokens - cached_len, step.budget_left, self.config.max_chunk_len)
        num_new = self._num_blocks(cached_len + num_tokens) - num_full
        if self.pool.num_free < num_new and self.cache is not None:
            self.cache.evict(num_new - self.pool.num_free)
        if self.pool.num_free < num_new:
            if self.cache is not None and match.last_node is not None:
                self.cache.unlock(match.last_node)
            return False
        ram = match._replace(cached_len=num_full * self.block_size) if loads else match
        table, copies = self._share(seq, ram)
        rest = self.pool.allocate(num_new - len(copies))
        assert rest is not None
        if self.cache is not None:
            self.cache.record_hit(match, seq.num_tokens - 1)  # admitted: count the hit once
        step.copies.extend(copies)
        step.loads.extend(zip(rest, loads))  # the first fresh blocks continue the RAM hit
        self._begin(seq, table + rest, cached_len)
        step.add(seq, num_tokens)
        return True

    def _disk_loads(self, seq: Sequence, match: MatchResult) -> list[bytes]:
        """Verified payloads of the full blocks the disk tier holds right after the RAM hit
        (the block a RAM hit ends inside included), leaving one token to compute; [] when
        there is no disk tier or it holds none of them. Reads files: only at admission."""
        if self.disk is None:
            return []
        first = match.cached_len // self.block_size
        max_blocks = (seq.num_tokens - 1) // self.block_size - first
        try:
            return self.disk.fetch(seq.namespace, seq.all_ids, first, max_blocks)
        except Exception as exc:  # noqa: BLE001 — a tier that fails to read is a miss, then off
            log.error("KV disk tier switched off for this engine: reading failed: %r", exc)
            self.disk = None
            return []

    def _lock_prefix(self, seq: Sequence) -> MatchResult:
        """Match the longest cached prefix leaving one token to compute, and lock it. A peek:
        the hit is recorded only once the sequence is admitted."""
        if self.cache is None:
            return MatchResult(0, [], None)
        match = self.cache.match(seq.namespace, seq.all_ids, seq.num_tokens - 1, record=False)
        assert match.last_node is not None
        self.cache.lock(match.last_node)
        return resume_point(match, self.snapshots, self.block_size)

    def _share(self, seq: Sequence, match: MatchResult) -> tuple[list[BlockId], list[tuple[BlockId, BlockId]]]:
        """The shared part of `seq`'s block table and its copies; the caller checked that
        a block is free for the copy. Copy sources are pinned until `on_tokens`."""
        if self.cache is None or match.last_node is None:
            return [], []
        shared = self.cache.share(match)
        assert shared is not None
        self._locks[seq.seq_id] = match.last_node
        for src, _ in shared.copies:
            self.pool.incref(src)  # the source must outlive this step's copy
            self._pinned.append(src)
        return shared.block_table, shared.copies

    def _begin(self, seq: Sequence, table: list[BlockId], cached_len: int) -> None:
        if seq.num_preemptions == 0:
            seq.cached_len = cached_len
        seq.block_table = table
        seq.num_computed = cached_len
        seq.status = SeqStatus.RUNNING
        self.waiting.remove(seq)
        self.running.append(seq)
        self.running.sort(key=lambda s: s.arrival)

    def on_tokens(self, sampled: dict[SeqId, int | list[int]]) -> None:
        """The last scheduled step ran: advance each chunk's KV, append sampled tokens
        (`sampled` must hold one for every chunk with samples=True of a sequence still
        running; a list of the accepted tokens for a verification chunk), and insert
        prefilled prefixes into the cache so others can hit them.
        Chunks of sequences finished or aborted since `schedule` are ignored."""
        if self._last is None:
            raise RuntimeError("on_tokens without a schedule: bug")
        out, self._last = self._last, None
        self.pool.free(self._pinned)
        self._pinned = []
        for chunk in out.chunks:
            seq = chunk.seq
            if seq.status is not SeqStatus.RUNNING:
                continue
            if seq.num_computed != chunk.start:
                raise RuntimeError(f"seq {seq.seq_id} computed {seq.num_computed}, chunk starts at {chunk.start}: bug")
            if chunk.samples and seq.seq_id not in sampled:
                raise ValueError(f"no sampled token for seq {seq.seq_id}")
            if chunk.draft:
                self.drafts.on_verified(chunk, sampled[seq.seq_id])
                continue
            seq.num_computed += chunk.num_tokens
            if chunk.samples:
                seq.output_ids.append(sampled[seq.seq_id])
            if not chunk.samples or chunk.start < len(seq.prompt_ids):
                self._insert_progress(seq)

    # -- the prefix cache -----------------------------------------------------------------
    def _insert_progress(self, seq: Sequence) -> None:
        """Cache what `seq` has computed so far and move its lock to the deepest node, so
        the in-flight prefix is neither computed twice nor evicted under it."""
        if self.cache is None:
            return
        _, node = self.cache.insert_node(seq.namespace, seq.ids(0, seq.num_computed), seq.block_table)
        self.cache.lock(node)
        self._unlock(seq)
        self._locks[seq.seq_id] = node

    # -- leaving -----------------------------------------------------------------------------
    def finish(self, seq_id: SeqId, reason: str) -> Sequence:
        """End a sequence normally: its computed tokens go to the cache, its blocks and
        lock are released. Returns the finished sequence."""
        return self._end(seq_id, SeqStatus.FINISHED, reason, insert=True)

    def abort(self, seq_id: SeqId) -> Sequence:
        """End a sequence at once, waiting or running, without caching its tokens."""
        return self._end(seq_id, SeqStatus.ABORTED, "abort", insert=False)

    def _end(self, seq_id: SeqId, status: SeqStatus, reason: str, insert: bool) -> Sequence:
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"seq {seq_id} is not scheduled")
        if seq.status is SeqStatus.RUNNING:
            self._release(seq, insert)
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = status
        seq.finish_reason = reason
        return seq

    def trim_output(self, seq_id: SeqId, num_output: int) -> None:
        """Keep the first `num_output` output tokens of a running sequence (DraftBlocks)."""
        self.drafts.trim_output(self._seqs[seq_id], num_output)

    def check_integrity(self) -> None:
        """Pool, tree and every block's holders agree (sched/integrity.py)."""
        check_scheduler(self)
