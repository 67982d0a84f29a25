"""The exactness contract on the hybrid families (gated DeltaNet + attention, Qwen3.5 text and
Qwen3-Next with its experts and fused qkvz projection; Mamba-2 + attention, Granite-4.0-H with
its experts and NoPE attention): logits bit-identical with the cache off and on (hits resumed
from the recurrent-state snapshot at a block end, split points on and off the boundaries),
across batch mixes, chunk sizes, f16 KV and a second turn that hits through decoded tokens,
speculation with rejected drafts, a restart from the disk tier; and the pool's accounting of
both memories (K/V blocks and state snapshots).
`np.array_equal`, never a tolerance.

Controls: a hit used token-exactly (no cut to the snapshot) resumes from a state that is not
the prefix's, a non-invariant matmul breaks the batch and chunk families, and rejected drafts
left in the state break speculation, snapshots lost on a disk load break the restart; all are
caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from agentkv.sched.draft import DRAFTERS
from tests.models.test_granite_hybrid import tiny_granite
from tests.models.test_hybrid import tiny_hybrid
from tests.runtime import test_speculative as spec
from tests.runtime.test_exactness import GREEDY, SplitKBackend, byte_level_tokenizer, rows_equal, run, tokens

BS = 4  # tokens per block: a state snapshot every 4 tokens
VOCAB = 256
PROMPT_LEN = 30


@pytest.fixture(scope="module", params=["qwen35", "qwen3next", "granite"])
def hybrid_dir(request, tmp_path_factory):
    """A tiny hybrid of each family: DeltaNet (Qwen3.5 text; Qwen3-Next, MoE) or Mamba-2
    (Granite-4.0-H, MoE)."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen35":
        tiny_hybrid(folder, "qwen3_5_text", seed=5, vocab_size=VOCAB)
    elif request.param == "qwen3next":
        tiny_hybrid(folder, "qwen3_next", seed=5, vocab_size=VOCAB)
    else:
        tiny_granite(folder, seed=5, vocab_size=VOCAB)
    byte_level_tokenizer(folder)
    return str(folder)


def make_engine(model, backend="cpu", chunk=512, prefix_cache=True, kv_dtype="f32", **config) -> Engine:
    cache = CacheConfig(num_blocks=96, block_size=BS, enable_prefix_cache=prefix_cache, dtype=kv_dtype)
    engine = Engine(
        EngineConfig(
            model=model, backend=backend, cache=cache, scheduler=SchedulerConfig(max_num_batched_tokens=chunk), **config
        )
    )
    engine.record_logits = True
    return engine


SPLITS = (6, 8, 17, PROMPT_LEN - 1)  # off and on the snapshot boundaries
BATCHES = (1, 4)  # unrelated requests riding along
CHUNKS = (1, 5)  # chunked prefill: cuts on and off the block boundaries


def hybrid_contract(
    model: str,
    backend: str = "cpu",
    kv_dtype: str = "f32",
    exact_hits: bool = False,
    variants=(SPLITS, BATCHES, CHUNKS),
    params: SamplingParams = GREEDY,
) -> list[str]:
    """Every variant's name that broke the contract. `exact_hits` (the control) lets a hit
    resume token-exactly instead of at the deepest snapshot; `variants`: the warm splits,
    batch widths and chunk sizes to run; `params` those of the request compared."""
    splits, batches, chunks = variants
    prompt = tokens(PROMPT_LEN, 1, VOCAB)
    engine_of = lambda **kw: make_engine(model, backend, kv_dtype=kv_dtype, **kw)  # noqa: E731
    cold = run(engine_of(prefix_cache=False), {"p": prompt}, params)[0]["p"]
    broken = []
    for split in splits:
        engine = engine_of()
        if exact_hits:
            engine.scheduler.snapshots = None
        # Two tokens: the first sampled one is computed too, so the cached path runs past the
        # split and a token-exact hit would end inside a block whose state is further on.
        run(engine, {"prefix": prompt[:split]}, SamplingParams(max_tokens=2, temperature=0.0))
        warm, outs = run(engine, {"p": prompt}, params)
        if not exact_hits:
            cached = outs["p"].cached_len
            assert cached % BS == 0 and split // BS * BS <= cached <= split + 1, (split, cached)
        if not rows_equal(warm["p"], cold):
            broken.append(f"warm split={split}")
    others = {f"o{i}": tokens(5 + 7 * i, 100 + i, VOCAB) for i in range(4)}
    for num in batches:
        got = run(engine_of(), {**dict(list(others.items())[:num]), "p": prompt}, params)[0]["p"]
        if not rows_equal(got, cold):
            broken.append(f"batched with {num}")
    for chunk in chunks:
        got = run(engine_of(chunk=chunk), {"p": prompt}, params)[0]["p"]
        if not rows_equal(got, cold):
            broken.append(f"chunk={chunk}")
    return broken


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_exact_reuse_hybrid(hybrid_dir, kv_dtype):
    assert hybrid_contract(hybrid_dir, kv_dtype=kv_dtype) == []


def test_second_turn_hits_through_decoded_tokens(hybrid_dir):
    """Turn 2 sends turn 1's prompt, its answer and more: the snapshots decode steps left
    serve it, and its logits equal a cold run's."""
    first = tokens(13, 7, VOCAB)
    engine = make_engine(hybrid_dir)
    _, outs = run(engine, {"t1": first}, SamplingParams(max_tokens=6, temperature=0.0))
    second = first + outs["t1"].token_ids + tokens(5, 8, VOCAB)
    warm, outs = run(engine, {"t2": second})
    cold = run(make_engine(hybrid_dir, prefix_cache=False), {"t2": second})[0]["t2"]
    assert outs["t2"].cached_len == (13 + 6 - 1) // BS * BS  # turn 1 computed 18 tokens
    assert rows_equal(warm["t2"], cold)


def test_preempted_sequence_resumes_exactly(hybrid_dir):
    """A pool too small for two prompts at once: the younger is preempted, its computed
    blocks (and snapshots) go to the cache, and it resumes from the deepest one."""
    prompt = tokens(PROMPT_LEN, 1, VOCAB)
    cold = run(make_engine(hybrid_dir, prefix_cache=False), {"p": prompt})[0]["p"]
    cache = CacheConfig(num_blocks=14, block_size=BS, dtype="f32")
    engine = Engine(EngineConfig(model=hybrid_dir, cache=cache, scheduler=SchedulerConfig(max_num_batched_tokens=8)))
    engine.record_logits = True
    got = run(engine, {"q": tokens(PROMPT_LEN, 9, VOCAB), "p": prompt})[0]["p"]
    assert engine.scheduler.preemptions >= 1 and rows_equal(got, cold)


def test_control_token_exact_hits_break_the_state(hybrid_dir):
    broken = hybrid_contract(hybrid_dir, exact_hits=True, variants=((6, 8, 17), (), ()))
    assert broken == ["warm split=6", "warm split=17"]  # a hit on a block end needs no cut


def test_control_non_invariant_matmul_is_caught(hybrid_dir):
    one = SamplingParams(max_tokens=1, temperature=0.0)  # the prompt's rows alone: few slow steps
    broken = hybrid_contract(hybrid_dir, SplitKBackend.name, variants=((), (1,), (16,)), params=one)
    assert broken == ["batched with 1", "chunk=16"]


@pytest.fixture
def oracle_drafter(monkeypatch):
    """test_speculative's drafter of plain decode's answers with one wrong token per draft."""
    monkeypatch.setitem(DRAFTERS, "oracle", spec.OracleDrafter)
    monkeypatch.setattr(spec.OracleDrafter, "truth", {})
    return spec.OracleDrafter


def test_speculation_with_rejected_drafts_is_bit_identical(hybrid_dir, oracle_drafter):
    """The oracle drafter drafts plain decode's answer with one wrong token: every request
    both accepts and rolls back, batched, after a cache hit; tokens, logprobs and logits
    rows equal plain decode's."""
    requests = spec.workload(VOCAB, spec.GREEDY, batched=True)
    plain = spec.run(spec.make_engine(hybrid_dir), requests)
    got, stats = spec.spec_run(hybrid_dir, "oracle", requests, plain)
    assert spec.same(got, plain)
    assert stats.prefix_hit_tokens > 0 and 0 < stats.spec_accepted_tokens < stats.spec_drafted_tokens


def test_control_rejected_drafts_left_in_the_state_are_caught(hybrid_dir, oracle_drafter):
    requests = {"p": (spec.copy_prompt(1, VOCAB), spec.GREEDY)}
    plain = spec.run(spec.make_engine(hybrid_dir), requests)
    oracle_drafter.truth[tuple(requests["p"][0])] = plain["p"][0]
    engine = spec.make_engine(hybrid_dir, "oracle")
    engine.runner.settle = lambda chunks, num_computed: None  # the control: no state rollback
    assert not spec.same(spec.run(engine, requests), plain)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_restart_from_the_disk_tier_is_bit_identical(hybrid_dir, tmp_path, kv_dtype):
    """A restarted engine serves a hybrid's transcript from disk: each block file carries the
    block's K/V and its state snapshot, so the hit resumes and its logits equal a cold run's.
    Control: the same restart with the snapshots zeroed on load is caught."""
    first = tokens(22, 21, VOCAB)
    disk = CacheConfig(num_blocks=96, block_size=BS, disk_dir=str(tmp_path), dtype=kv_dtype)
    config = lambda: EngineConfig(model=hybrid_dir, cache=disk)  # noqa: E731
    before = Engine(config())
    before.record_logits = True
    _, outs = run(before, {"t1": first})
    before.close()  # writes back what the RAM cache holds
    second = first + outs["t1"].token_ids + tokens(6, 22, VOCAB)
    cold = run(make_engine(hybrid_dir, prefix_cache=False, kv_dtype=kv_dtype), {"t2": second})[0]["t2"]
    for zeroed in (False, True):
        after = Engine(config())
        after.record_logits = True
        if zeroed:  # the control: K/V from disk, the recurrent state not
            kv_bytes, write = after.model.kv_spec(1, BS).bytes_per_block, after.disk.write_block
            flag = kv_bytes + after.runner.states.bytes_per_slot  # the snapshot flag stays
            zero = lambda data, n=kv_bytes, f=flag: data[:n] + bytes(f - n) + data[f:]  # noqa: E731
            after.disk.write_block = lambda b, data, w=write, z=zero: w(b, z(data))
        warm, outs = run(after, {"t2": second})
        assert outs["t2"].cached_len == 24  # 25 tokens computed before the restart: 6 full blocks
        assert rows_equal(warm["t2"], cold) != zeroed


@pytest.mark.parametrize(("max_tokens", "kept"), [(15, {2, 4, 5, 8}), (13, {2, 4, 5, 7})])
def test_sparse_snapshots_resume_exactly_and_hold_less(hybrid_dir, max_tokens, kept):
    """`snapshot_every=3`: every third block end keeps its state, and the prefill's last (where
    the prompt stopped); while decoding, only the latest block end is kept besides, and it stays
    when the request ends. A second turn resumes from the deepest, bit-identical to a cold run,
    while the store holds those snapshots alone. Control: resuming from a block end whose
    transient snapshot was superseded (b7 once b8 ended) fails."""
    first = tokens(22, 31, VOCAB)  # blocks 0..4 full and 21 in block 5: the prefill keeps b2, b4
    cache = CacheConfig(num_blocks=96, block_size=BS, dtype="f32", snapshot_every=3)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    engine = Engine(EngineConfig(model=hybrid_dir, cache=cache))
    engine.record_logits = True
    _, outs = run(engine, {"t1": first}, params)
    computed = 22 + max_tokens - 1
    states = engine.runner.states
    ns = (engine.model_name, None)
    blocks = engine.cache.match(ns, first + outs["t1"].token_ids, 64, record=False).block_table
    assert {j for j, b in enumerate(blocks) if states.has(b)} == kept  # b5, b8 every third; b7 the latest
    assert states.bytes_held == len(kept) * states.bytes_per_slot  # finished: no running state
    second = first + outs["t1"].token_ids + tokens(5, 32, VOCAB)
    cold = run(make_engine(hybrid_dir, prefix_cache=False), {"t2": second})[0]["t2"]
    warm, outs = run(engine, {"t2": second})
    assert outs["t2"].cached_len == computed // BS * BS == (max(kept) + 1) * BS
    assert rows_equal(warm["t2"], cold)
    if 8 not in kept:
        return
    control = Engine(EngineConfig(model=hybrid_dir, cache=cache))
    control.record_logits = True
    run(control, {"t1": first}, params)
    control.scheduler.snapshots = replace(control.scheduler.snapshots, has=lambda block: True)
    with pytest.raises(KeyError):  # the step fails: no state to resume from (RuntimeError logged)
        run(control, {"t2": second[: 8 * BS + 1]})


@pytest.mark.parametrize("every", [1, 3])
def test_pool_counts_both_memories_and_eviction_frees_the_snapshots(hybrid_dir, every):
    """A memory budget buys blocks of K/V plus a snapshot's share (state bytes / snapshot_every
    each); evicting the cache gives back the blocks and their snapshots' bytes. Control: the
    same budget counted as K/V alone would hold more blocks than the pool got."""
    probe = make_engine(hybrid_dir)
    kv_block = probe.model.kv_spec(1, BS).bytes_per_block
    per_block = kv_block + probe.model.state_bytes // every
    budget = 200 * per_block + per_block // 2
    cache = CacheConfig(memory_bytes=budget, block_size=BS, dtype="f32", snapshot_every=every)
    engine = Engine(EngineConfig(model=hybrid_dir, cache=cache, max_model_len=64))
    engine.record_logits = True
    assert engine.num_blocks == budget // per_block == 200
    assert budget // kv_block > engine.num_blocks  # the control: state bytes do take room
    states = engine.runner.states
    run(engine, {"t1": tokens(PROMPT_LEN, 3, VOCAB)}, SamplingParams(max_tokens=6, temperature=0.0))
    assert states.bytes_held > 0 and engine.pool.num_used > 0  # the finished turn's blocks stay cached
    engine.flush_cache()
    assert states.bytes_held == 0 and engine.pool.num_used == 0
