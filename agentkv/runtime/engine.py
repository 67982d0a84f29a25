"""The engine loop: admit requests, step the scheduler, run the model, sample, stream.

Synchronous and single-threaded by design; `AsyncEngine` drives it from its own thread. Its
collaborators are objects it holds, each built here with what it needs:

    Engine ── scheduler (sched/) ── cache + pool (cache/), disk tier (read side)
      ├─ runner (model + KV store)          ├─ speculation (drafters per namespace, verify)
      └─ disk (runtime/kv_disk.py: write side, loads, close, flush)
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from agentkv.cache import BlockPool, RadixCache
from agentkv.cache.pins import PinBudget
from agentkv.formats.tokenizer import IncrementalDecoder
from agentkv.runtime.adapters import AdapterRegistry
from agentkv.runtime.config import EngineConfig
from agentkv.runtime.engine_state import compute_stats
from agentkv.runtime.errors import InvalidTokenError, KVCapacityError, NotAGeneratorError, PromptTooLongError
from agentkv.runtime.fingerprint import fingerprint_parts
from agentkv.runtime.hybrid import disk_layout, snapshot_every, snapshots_of
from agentkv.runtime.kv_disk import KVDisk, tenant_of
from agentkv.runtime.loading import load, pool_size, weights_summary
from agentkv.runtime.outputs import Counters, EngineStats, RequestOutput, TokenLogprob
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.request import Request
from agentkv.runtime.runner import Chunk, ModelRunner, adapter_of
from agentkv.runtime.sampler import SamplingState, check_logits, logsumexp, sample, token_logprob, top_logprobs
from agentkv.runtime.speculation import Speculation
from agentkv.runtime.stop import StopChecker
from agentkv.sched import Scheduler, SeqStatus, Sequence

log = logging.getLogger(__name__)
IDLE_WAIT_S = 1.0  # longest wait of an engine with work it cannot start (AsyncEngine)
ALL_TENANTS = object()  # flush_cache(ALL_TENANTS): every namespace


class Engine:
    """One model, one KV store, one scheduler. Not thread-safe: one thread calls it, except
    `validate` and `stats`, which any thread may call.

    Failure isolation: a refused request raises a ValueError subclass from `add_request`
    and leaves nothing registered; a request that fails inside a step (its sampling, grammar
    or detokenizer) ends alone with a RequestOutput of finish_reason "error" and its `error`
    message (see runtime.errors), while the rest of the batch runs on with the tokens it
    would have had alone; a step whose block copies, disk loads or model run raise fails the
    requests of that step alone and the engine goes on; a failing drafter switches
    speculation off and a failing disk write turns the tier read-only, both logged."""

    def __init__(self, config: EngineConfig):
        self.config = config
        t0 = time.perf_counter()
        self.source, self.backend, self.model, self.tokenizer, self.chat_template = load(config)
        hp = self.model.hparams
        self.model_name = config.served_model_name or config.model
        self.max_model_len = min(config.max_model_len or hp.context_len, hp.context_len)
        self.vocab_size = self.model.vocab_size
        self.is_embedding = self.model.is_embedding
        self.block_size = config.cache.block_size
        self.snapshot_every = snapshot_every(self.model, self.block_size, config.cache.snapshot_every)
        self.num_blocks = pool_size(config, self.model, self.max_model_len, self.snapshot_every)
        self.pool = BlockPool(self.num_blocks)
        self.cache = RadixCache(self.pool, self.block_size)
        self.runner = None
        if not self.is_embedding:
            self.runner = ModelRunner(self.model, self.num_blocks, self.block_size, self.snapshot_every)
            if self.runner.states is not None:
                self.pool.on_free = self.runner.states.release  # a freed block's snapshot goes with it
        self.disk = self._open_disk()
        tier = self.disk.tier if self.disk is not None else None
        snapshots = snapshots_of(self.runner, self.model.kv_spec(1, self.block_size).bytes_per_block)
        self.scheduler = Scheduler(config.scheduler, self.pool, self.cache, config.cache.view, tier, snapshots)
        self.counters = Counters()
        spec = config.speculative
        self.speculation = Speculation(spec, config.num_speculative_tokens, self.counters) if spec else None
        # Tests of the exactness contract read the sampled logits rows: request id -> rows.
        self.record_logits = False
        self.recorded: dict[str, list[np.ndarray]] = {}
        if self.speculation is not None:
            self.speculation.record = self._record
        self._requests: dict[str, Request] = {}
        self._by_seq: dict[int, Request] = {}
        self._seq_ids = itertools.count()
        self.progressed = True  # whether the last step ran anything (AsyncEngine idles when not)
        self.adapters = None if self.is_embedding else AdapterRegistry(self.model)  # LoRA, by name
        self._stats = compute_stats(self)
        load_s = time.perf_counter() - t0
        summary = weights_summary(self.source, self.model)
        if self.model.state_bytes:
            summary += (
                f"; recurrent-state snapshots of {self.model.state_bytes / 2**20:.2f} MiB every "
                f"{self.snapshot_every} blocks (--snapshot-every)"
            )
        log.info(
            "loaded %s (%s, %s backend) in %.1fs; KV: %d blocks x %d tokens; %s",
            *(config.model, hp.arch, self.backend.name, load_s, self.num_blocks, self.block_size, summary),
        )

    def _open_disk(self) -> KVDisk | None:
        cc = self.config.cache
        if cc.disk_dir is None or self.runner is None:
            return None
        parts = fingerprint_parts(self, Path(cc.disk_dir))
        spec, io = disk_layout(self.model, self.runner, self.block_size)  # a hybrid's blocks carry their snapshot
        disk = KVDisk(cc.disk_dir, cc.disk_bytes, parts, spec, io, cc.write_through)
        disk.attach(self.cache)
        log.info("%s", disk.describe())
        return disk

    # -- requests -------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise a ValueError subclass for a request that can never run (pure: call it from
        any thread): an embedding model, an empty or too long prompt, a token outside the
        vocabulary, a prompt + max_tokens that needs more KV blocks than the whole pool."""
        if self.is_embedding:
            raise NotAGeneratorError(self.model_name)
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if len(prompt_ids) >= self.max_model_len:
            raise PromptTooLongError(len(prompt_ids), self.max_model_len)
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise InvalidTokenError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        params.check_vocab(self.vocab_size)
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt_ids))
        num_needed = -(-(len(prompt_ids) + max_tokens) // self.block_size)
        if num_needed > self.num_blocks:
            raise KVCapacityError(len(prompt_ids), max_tokens, num_needed, self.num_blocks, self.block_size)

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        constraint: Any = None,
        namespace: Hashable = None,
        index: int = 0,
    ) -> None:
        """Queue a request (mutates). Raises ValueError subclasses for bad input, and then
        nothing of the request stays registered. `index` is the request's place among the n
        choices of one API call (seeds it as seed + index)."""
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate(prompt_ids, params)
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt_ids))
        ns = (self.model_name, namespace)
        if params.prompt_logprobs is not None:
            ns = (*ns, "prompt-logprobs", request_id)  # every prompt row's logits are needed: no hit
        ids = list(map(int, prompt_ids))
        seq = Sequence(seq_id=next(self._seq_ids), namespace=ns, prompt_ids=ids, max_tokens=max_tokens)
        stop = StopChecker(replace(params, max_tokens=max_tokens), self.tokenizer.eos_ids)
        detok = IncrementalDecoder(self.tokenizer, params.skip_special_tokens)
        req = Request(request_id, seq, params, SamplingState.create(params, prompt_ids, index), stop, detok, constraint)
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        req.draft = self.speculation.draft_length(params, constraint) if self.speculation is not None else None
        self.scheduler.add(seq)  # the last step that can raise: register only after it
        self._requests[request_id] = req
        self._by_seq[seq.seq_id] = req
        self.counters.prompt_tokens += len(prompt_ids)
        self._publish_stats()

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV at once (mutates). None if it is unknown/finished."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._end(req, "abort")
        out = self._emit(req, finished=True)
        self._publish_stats()
        return out

    def _end(self, req: Request, reason: str) -> None:
        if req.seq.status in (SeqStatus.RUNNING, SeqStatus.WAITING):
            self.scheduler.abort(req.seq.seq_id)
        req.finish_reason = reason

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and run one batch; return outputs of requests that made progress, or
        that ended with an error (finish_reason "error"); publishes a fresh `stats()` and sets
        `progressed` (False: nothing could run, e.g. every block is held)."""
        if self.runner is None:
            return []  # an embedding model: add_request refused every generation
        if self.speculation is not None:
            self.speculation.propose(self._requests.values())
        plan = self.scheduler.schedule()
        self.progressed = bool(plan.chunks)
        outputs = self._transfer(plan)  # copies and disk loads: a failure ends its request alone
        scheduled = [sc for sc in plan.chunks if sc.seq.status is SeqStatus.RUNNING]
        chunks = [self._chunk(sc) for sc in scheduled]
        try:
            logits = self.runner.run(chunks) if chunks else None
        except Exception as exc:  # noqa: BLE001 — the batch's requests fail, the engine goes on
            log.error("the model run of a step of %d chunks failed: %r", len(chunks), exc)
            self.counters.step_failures += 1
            outputs += [self._fail(self._by_seq[sc.seq.seq_id], exc) for sc in scheduled]
            chunks = []
        if not chunks:
            self.scheduler.on_tokens({})  # closes the step: copy sources unpinned, ended chunks skipped
            self._publish_stats()
            return outputs
        self.counters.steps += 1
        self.counters.computed_tokens += sum(len(c.token_ids) for c in chunks)
        if self.disk is not None:
            self.disk.after_step(scheduled)
        outputs += self._consume(scheduled, chunks, logits)
        self.runner.settle(chunks, [sc.seq.num_computed for sc in scheduled])  # hybrids: rejected drafts
        self._publish_stats()
        return outputs

    def _transfer(self, plan) -> list[RequestOutput]:
        """Run the step's block copies and disk loads, one request's at a time; a request
        whose transfer raises ends with the error (its blocks are its own), the rest run."""
        owner = {b: sc.seq.seq_id for sc in plan.chunks for b in sc.seq.block_table}
        jobs = [(dst, functools.partial(self.runner.copy_blocks, [(src, dst)])) for src, dst in plan.copies]
        if self.disk is not None:
            jobs += [(block, functools.partial(self.disk.apply_loads, [(block, data)])) for block, data in plan.loads]
        outputs = []
        for block, job in jobs:
            req = self._by_seq.get(owner.get(block, -1))
            if req is None or req.seq.status is not SeqStatus.RUNNING:
                continue
            try:
                job()
            except Exception as exc:  # noqa: BLE001
                self.counters.step_failures += 1
                outputs.append(self._fail(req, exc))
        return outputs

    def _chunk(self, sc) -> Chunk:
        req = self._by_seq[sc.seq.seq_id]
        in_prompt = req.prompt_logprobs is not None and sc.start < len(sc.seq.prompt_ids)
        want = "all" if in_prompt or sc.draft else ("last" if sc.samples else None)
        return Chunk(sc.token_ids, sc.start, sc.seq.block_table, want, adapter_of(sc.seq.namespace), bool(sc.draft))

    def _consume(self, scheduled, chunks, logits) -> list[RequestOutput]:
        """Sample each row on its own; a request whose row fails is aborted before the
        scheduler advances the step, so the others' bookkeeping never sees it."""
        row, sampled, failed = 0, [], []
        for sc, chunk in zip(scheduled, chunks):
            if chunk.logits is None:
                continue
            n = len(chunk.token_ids) if chunk.logits == "all" else 1
            rows, row = logits[row : row + n], row + n
            req = self._by_seq[sc.seq.seq_id]
            try:
                result = self._sample_chunk(req, sc, chunk.logits, rows)
            except Exception as e:  # noqa: BLE001 — one request's failure ends that request only
                failed.append((req, e))
                continue
            if result is not None:
                sampled.append((req, result))
        outputs = [self._fail(req, e) for req, e in failed]
        self.scheduler.on_tokens(
            {req.seq.seq_id: [x.token_id for x in r] if isinstance(r, list) else r.token_id for req, r in sampled}
        )
        for req, result in sampled:
            try:
                outputs.append(self._advance(req, result if isinstance(result, list) else [result]))
            except Exception as e:  # noqa: BLE001 — e.g. a grammar or detokenizer error
                outputs.append(self._fail(req, e))
        return outputs

    def _sample_chunk(self, req: Request, sc, want: str, rows: np.ndarray):
        """Prompt logprobs of `rows` when asked, and the sample of the last row when the
        chunk samples (None otherwise; a list of samples for a verification chunk). Raises
        for this request alone."""
        if sc.draft:
            return self.speculation.verify(req, sc, rows)
        if want == "all":
            self._prompt_logprobs(req, sc.start, rows)
        if not sc.samples:
            return None
        self._record(req.request_id, rows[-1])
        return sample(rows[-1], req.params, req.sampling, self._allowed(req))

    def _record(self, request_id: str, row: np.ndarray) -> None:
        if self.record_logits:
            self.recorded.setdefault(request_id, []).append(row.copy())

    def _fail(self, req: Request, error: Exception) -> RequestOutput:
        """End one request whose step raised (mutates: frees its KV); the others go on."""
        log.warning("request %s failed: %r", req.request_id, error)
        self._end(req, "error")
        out = self._emit(req, finished=True)
        out.error = f"{type(error).__name__}: {error}"
        return out

    def _allowed(self, req: Request) -> np.ndarray | None:
        return req.constraint.allowed_mask() if req.constraint is not None else None

    def _prompt_logprobs(self, req: Request, start: int, rows: np.ndarray) -> None:
        check_logits(rows)
        prompt = req.seq.prompt_ids
        k = req.params.prompt_logprobs or 0
        for i, logits_row in enumerate(rows):
            target = start + i + 1
            if target >= len(prompt):
                break
            lse = logsumexp(logits_row)
            tok = prompt[target]
            req.prompt_logprobs.append(
                TokenLogprob(tok, token_logprob(logits_row[tok], lse), top_logprobs(logits_row, lse, k))
            )

    def _advance(self, req: Request, results: list) -> RequestOutput:
        """Take the sampled tokens (one, or a verification's accepted ones) one by one as
        plain decode would; a stop among them drops the rest (their KV is rolled back)
        before the request finishes."""
        for j, result in enumerate(results):
            if not req.take(result, self.counters):
                continue
            num_dropped = len(results) - j - 1
            if num_dropped:
                self.scheduler.trim_output(req.seq.seq_id, len(req.sampling.output_ids))
                if self.record_logits:
                    del self.recorded[req.request_id][-num_dropped:]
            self.scheduler.finish(req.seq.seq_id, req.finish_reason)
            return self._emit(req, True)
        return self._emit(req, False)

    def _emit(self, req: Request, finished: bool) -> RequestOutput:
        out = req.emit(finished)
        if finished:
            self._requests.pop(req.request_id, None)
            self._by_seq.pop(req.seq.seq_id, None)
            if self.speculation is not None:
                self.speculation.end(req)
        return out

    # -- the cache and introspection --------------------------------------------------------
    def stats(self) -> EngineStats:
        """The counters and gauges as of the end of the last step, add or abort. Thread-safe:
        the engine thread publishes a new immutable snapshot after each of those."""
        return self._stats

    def _publish_stats(self) -> None:
        self._stats = compute_stats(self)  # one reference swap: readers see old or new

    def pin_prefix(self, token_ids: list[int], namespace: Hashable = None, ttl_s: float = 300.0) -> int:
        """Keep the cached prefix of `token_ids` (in a request `namespace`) from eviction for
        `ttl_s` seconds (mutates the cache); returns how many tokens are pinned, 0 when none
        are cached or a new pin would pass the pin budget (in all, or the namespace's)."""
        cc = self.config.cache
        budget = PinBudget(
            self.num_blocks // 2 if cc.max_pinned_blocks is None else cc.max_pinned_blocks,
            self.num_blocks // 4 if cc.max_pinned_blocks_per_tenant is None else cc.max_pinned_blocks_per_tenant,
        )
        pinned = self.cache.pin((self.model_name, namespace), list(map(int, token_ids)), ttl_s, budget)
        self._publish_stats()
        return pinned

    def idle_wait_s(self) -> float:
        """How long a loop whose last step ran nothing may sleep before anything can change
        by itself (the next pin's expiry; add, abort and pin wake it anyway)."""
        wait = self.cache.pin_wait_s()
        return IDLE_WAIT_S if wait is None else min(IDLE_WAIT_S, wait)

    def flush_cache(self, tenant: object = ALL_TENANTS) -> int:
        """Drop the cached KV of one tenant (a `tenant_of` group such as "tenant:NAME", or
        "shared"), or of all with ALL_TENANTS, from RAM (its pins too; running requests keep
        what they use) and from the disk tier (mutates); returns the RAM blocks freed."""
        num_freed = 0
        for namespace in self.cache.namespaces():
            if tenant is ALL_TENANTS or tenant_of(namespace) == tenant:
                num_freed += self.cache.evict_namespace(namespace)
        if self.disk is not None:
            self.disk.remove(None if tenant is ALL_TENANTS else str(tenant))
        self._publish_stats()
        return num_freed

    def free_cache(self) -> int:
        """Evict every unlocked cached block (mutates); returns how many returned to the pool."""
        num_freed = self.cache.evict(self.num_blocks)
        self._publish_stats()
        return num_freed

    def close(self) -> int:
        """Write back what the RAM cache holds (unlocked entries), flush the disk tier within
        its bound and stop its writer; returns the blocks left unwritten. Idempotent; called
        by the engine thread when it stops (SIGTERM: the server's shutdown), or by a
        synchronous owner."""
        return self.disk.close(self.cache) if self.disk is not None else 0
