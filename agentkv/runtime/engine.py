"""The engine loop: admit requests, step the scheduler, run the model, sample, stream.

Synchronous and single-threaded by design; `AsyncEngine` drives it from its own thread.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agentkv.cache import BlockPool, RadixCache
from agentkv.formats.chat_template import load_chat_template
from agentkv.formats.errors import ChatTemplateError
from agentkv.formats.resolve import open_model
from agentkv.formats.tokenizer import IncrementalDecoder, load_tokenizer
from agentkv.hal.identity import describe
from agentkv.hal.registry import lookup
from agentkv.models.base import LoadOptions
from agentkv.models.registry import load_model
from agentkv.runtime.config import DEFAULT_KV_MEMORY, EngineConfig
from agentkv.runtime.engine_state import EngineState
from agentkv.runtime.errors import InvalidTokenError, KVCapacityError, NotAGeneratorError, PromptTooLongError
from agentkv.runtime.kv_disk import open_disk, write_through
from agentkv.runtime.outputs import Counters, RequestOutput, TokenLogprob
from agentkv.runtime.params import SamplingParams
from agentkv.runtime.runner import Chunk, ModelRunner, adapter_of
from agentkv.runtime.sampler import SamplingState, check_logits, logsumexp, sample, token_logprob, top_logprobs
from agentkv.runtime.speculation import SpeculativeEngine
from agentkv.runtime.stop import StopChecker
from agentkv.sched import Scheduler, SeqStatus, Sequence
from agentkv.sched.draft import DraftLength, make_drafter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request:
    request_id: str
    seq: Sequence
    params: SamplingParams
    sampling: SamplingState
    stop: StopChecker
    detok: IncrementalDecoder
    constraint: Any = None
    text: str = ""
    sent_chars: int = 0
    sent_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    first_sent: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    arrival: float = 0.0
    draft: DraftLength | None = None  # None: this request never drafts


class Engine(SpeculativeEngine, EngineState):
    """One model, one KV store, one scheduler. Not thread-safe: one thread calls it, except
    `validate` and `stats`, which any thread may call.

    Failure isolation: a refused request raises a ValueError subclass from `add_request`
    and leaves nothing registered; a request that fails inside a step ends alone with a
    RequestOutput of finish_reason "error" and its `error` message (see runtime.errors),
    while the rest of the batch runs on with the tokens it would have had alone."""

    def __init__(self, config: EngineConfig):
        self.config = config
        t0 = time.perf_counter()
        self.source = open_model(config.model)
        backend = self.backend = lookup(config.backend, config.cache.dtype, config.activation_dtype)
        log.info("%s, kv %s, activations %s", describe(backend.identity), backend.kv_dtype, backend.activation_dtype)
        self.model = load_model(self.source, self.backend, LoadOptions(weights=config.weights))
        self.tokenizer = load_tokenizer(self.source)
        try:
            self.chat_template = load_chat_template(self.source)
        except ChatTemplateError:
            self.chat_template = None
        hp = self.model.hparams
        self.model_name = config.served_model_name or config.model
        self.max_model_len = min(config.max_model_len or hp.context_len, hp.context_len)
        self.vocab_size = self.model.vocab_size
        self.is_embedding = self.model.is_embedding
        self.block_size = config.cache.block_size
        self.num_blocks = self._num_blocks()
        self._check_pool_fits()
        self.pool = BlockPool(self.num_blocks)
        self.cache = RadixCache(self.pool, self.block_size)
        self.runner = None if self.is_embedding else ModelRunner(self.model, self.num_blocks, self.block_size)
        self.disk = open_disk(self)
        self.scheduler = Scheduler(config.scheduler, self.pool, self.cache, config.cache.view, self.disk)
        self.counters = Counters()
        self.drafter = make_drafter(config.speculative) if config.speculative else None
        # Tests of the exactness contract read the sampled logits rows: request id -> rows.
        self.record_logits = False
        self.recorded: dict[str, list[np.ndarray]] = {}
        self._requests: dict[str, _Request] = {}
        self._by_seq: dict[int, _Request] = {}
        self._seq_ids = itertools.count()
        self._stats = self._compute_stats()
        log.info(
            "loaded %s (%s, %s backend) in %.1fs; KV: %d blocks x %d tokens; %s",
            config.model,
            hp.arch,
            self.backend.name,
            time.perf_counter() - t0,
            self.num_blocks,
            self.block_size,
            self.weights_summary(),
        )

    def weights_summary(self) -> str:
        """Which tensors stayed quantized and which fell back to f32 (for the load log)."""
        from agentkv.formats.quants import QUANT_NAMES

        infos = {n: self.source.tensor(n) for n in self.model.weight_formats}
        src = {n: info.qtype for n, info in infos.items()}
        kept = sum(1 for n, q in self.model.weight_formats.items() if q == src[n] and q not in (0, 1))
        fell = sorted(  # vectors (norms, biases) are f32 by design, whatever the file holds
            {
                QUANT_NAMES.get(src[n], str(src[n]))
                for n, q in self.model.weight_formats.items()
                if q != src[n] and len(infos[n].shape) > 1
            }
        )
        return f"{kept} weights resident quantized" + (f", dequantized to f32: {', '.join(fell)}" if fell else "")

    def _num_blocks(self) -> int:
        cc = self.config.cache
        if cc.num_blocks is not None:
            return cc.num_blocks
        per_block = self.model.kv_spec(1, self.block_size).bytes_per_block
        budget = cc.memory_bytes or DEFAULT_KV_MEMORY
        needed = math.ceil(self.max_model_len / self.block_size) + 1
        num = budget // per_block
        if num < needed and cc.memory_bytes is not None:
            raise ValueError(
                f"kv cache memory {budget} bytes holds {num} blocks, fewer than one "
                f"max_model_len sequence needs ({needed}); raise it or lower max_model_len"
            )
        return max(int(num), needed)

    def _check_pool_fits(self) -> None:
        """The KV pool should hold one max_model_len sequence. When max_model_len was asked
        for explicitly, a smaller pool is a contradiction and raises; when it is the model's
        own context, the engine warns and refuses (KVCapacityError at add_request) only the
        requests that need more than the whole pool."""
        capacity = self.num_blocks * self.block_size
        if capacity >= self.max_model_len:
            return
        message = (
            f"the KV pool holds {self.num_blocks} blocks x {self.block_size} = {capacity} "
            f"tokens, fewer than one max_model_len sequence ({self.max_model_len} tokens); "
            f"raise --kv-cache-blocks / --kv-cache-memory or lower --max-model-len"
        )
        if self.config.max_model_len is not None:
            raise ValueError(message)
        log.warning("%s; requests needing more than %d tokens will be refused", message, capacity)

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
        seq = Sequence(
            seq_id=next(self._seq_ids), namespace=ns, prompt_ids=list(map(int, prompt_ids)), max_tokens=max_tokens
        )
        req = _Request(
            request_id,
            seq,
            params,
            SamplingState.create(params, prompt_ids, index),
            StopChecker(replace(params, max_tokens=max_tokens), self.tokenizer.eos_ids),
            IncrementalDecoder(self.tokenizer, params.skip_special_tokens),
            constraint,
            arrival=time.perf_counter(),
        )
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        req.draft = self._draft_length(params, constraint)
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
        if req.seq.status in (SeqStatus.RUNNING, SeqStatus.WAITING):
            self.scheduler.abort(req.seq.seq_id)
        req.finish_reason = "abort"
        out = self._emit(req, finished=True)
        self._publish_stats()
        return out

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and run one batch; return outputs of requests that made progress, or
        that ended with an error (finish_reason "error"); publishes a fresh `stats()`."""
        if self.runner is None:
            return []  # an embedding model: add_request refused every generation
        if self.drafter is not None:
            self._propose_drafts()
        plan = self.scheduler.schedule()
        self.runner.copy_blocks(list(plan.copies))
        self._apply_loads(plan.loads)
        if not plan.chunks:
            self._publish_stats()
            return []
        chunks = []
        for sc in plan.chunks:
            req = self._by_seq[sc.seq.seq_id]
            in_prompt = req.prompt_logprobs is not None and sc.start < len(sc.seq.prompt_ids)
            want = "all" if in_prompt or sc.draft else ("last" if sc.samples else None)
            chunks.append(Chunk(sc.token_ids, sc.start, sc.seq.block_table, want, adapter_of(sc.seq.namespace)))
        logits = self.runner.run(chunks)
        self.counters.steps += 1
        self.counters.computed_tokens += sum(len(c.token_ids) for c in chunks)
        if self.disk is not None and self.config.cache.write_through:
            write_through(self.disk, plan.chunks, self.block_size)
        outputs = self._consume(plan.chunks, chunks, logits)
        self._publish_stats()
        return outputs

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
                verified = isinstance(result, list)
                outputs.append(self._advance_verified(req, result) if verified else self._advance(req, result))
            except Exception as e:  # noqa: BLE001 — e.g. a grammar or detokenizer error
                outputs.append(self._fail(req, e))
        return outputs

    def _sample_chunk(self, req: _Request, sc, want: str, rows: np.ndarray):
        """Prompt logprobs of `rows` when asked, and the sample of the last row when the
        chunk samples (None otherwise; a list of samples for a verification chunk). Raises
        for this request alone."""
        if sc.draft:
            return self._verify(req, sc, rows)
        if want == "all":
            self._prompt_logprobs(req, sc.start, rows)
        if not sc.samples:
            return None
        if self.record_logits:
            self.recorded.setdefault(req.request_id, []).append(rows[-1].copy())
        return sample(rows[-1], req.params, req.sampling, self._allowed(req))

    def _fail(self, req: _Request, error: Exception) -> RequestOutput:
        """End one request whose step raised (mutates: frees its KV); the others go on."""
        log.warning("request %s failed: %r", req.request_id, error)
        if req.seq.status in (SeqStatus.RUNNING, SeqStatus.WAITING):
            self.scheduler.abort(req.seq.seq_id)
        req.finish_reason = "error"
        out = self._emit(req, finished=True)
        out.error = f"{type(error).__name__}: {error}"
        return out

    def _allowed(self, req: _Request) -> np.ndarray | None:
        return req.constraint.allowed_mask() if req.constraint is not None else None

    def _prompt_logprobs(self, req: _Request, start: int, rows: np.ndarray) -> None:
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

    def _advance(self, req: _Request, result) -> RequestOutput:
        finished = self._take(req, result)
        if finished:
            self.scheduler.finish(req.seq.seq_id, req.finish_reason)
        return self._emit(req, finished)

    def _take(self, req: _Request, result) -> bool:
        """Append one sampled token to the request: logprobs, grammar, text, stop checks
        (mutates the request, not the scheduler). Returns whether the request finished."""
        tok = result.token_id
        req.sampling.append(tok)
        self.counters.generation_tokens += 1
        if req.params.logprobs is not None:
            req.logprobs.append(TokenLogprob(tok, result.logprob, result.top_logprobs))
        if req.constraint is not None:
            req.constraint.accept(tok)
        new_text = req.detok.push(tok)
        decision = req.stop.check(tok, req.text + new_text, new_text)
        if decision.finished and isinstance(decision.matched, int):
            # A stop token's text is not part of the answer (a stop id's only when asked).
            if not (req.params.include_stop_str_in_output and tok in req.params.stop_token_ids):
                new_text = ""
        req.text += new_text
        if decision.trim_text_to is not None:
            req.text = req.text[: decision.trim_text_to]
        finished = decision.finished
        if not finished and req.constraint is not None and req.constraint.is_finished():
            finished, req.finish_reason = True, "stop"
        if decision.finished:
            req.finish_reason, req.stop_reason = decision.reason, decision.matched
        if finished and decision.trim_text_to is None and decision.matched is None:
            req.text += req.detok.flush()
        return finished

    def _emit(self, req: _Request, finished: bool) -> RequestOutput:
        hold = 0 if finished else req.stop.holdback_len(req.text)
        upto = max(req.sent_chars, len(req.text) - hold)
        delta = req.text[req.sent_chars : upto]
        ids = req.sampling.output_ids
        out = RequestOutput(
            request_id=req.request_id,
            prompt_len=len(req.seq.prompt_ids),
            cached_len=req.seq.cached_len,
            text=req.text[:upto],
            delta_text=delta,
            token_ids=list(ids),
            delta_token_ids=list(ids[req.sent_tokens :]),
            logprobs=req.logprobs[req.sent_tokens :] if req.params.logprobs is not None else None,
            prompt_logprobs=req.prompt_logprobs if not req.first_sent else None,
            finished=finished,
            finish_reason=req.finish_reason if finished else None,
            stop_reason=req.stop_reason if finished else None,
        )
        req.sent_chars, req.sent_tokens, req.first_sent = upto, len(ids), True
        if finished:
            self._requests.pop(req.request_id, None)
            self._by_seq.pop(req.seq.seq_id, None)
            if self.drafter is not None:
                self.drafter.end(req.seq.seq_id, req.seq.all_ids)
        return out
