"""The exactness contract (docs/design.md): a request's logits are bit-identical whether its prefix
came from the cache or was computed, whether it ran alone or batched, however it was chunked.

Every comparison is `np.array_equal` on float32 logits rows — never a tolerance. A control
runs the same checks on a backend with a deliberately non-invariant matmul and asserts that
every family of variants (warm split, batched, chunked) catches it, so none of them can pass
vacuously."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from agentkv.hal.base import Backend, Layout, Tensor
from agentkv.hal.cpu import CpuBackend
from agentkv.hal.registry import register
from agentkv.runtime.config import CacheConfig, EngineConfig
from agentkv.runtime.engine import Engine
from agentkv.runtime.outputs import merge_into
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from tests.models.helpers import tiny_hf_model

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


class SplitKBackend(CpuBackend):
    """The control: an f32 matmul split along K into `rows % 3 + 1` slices summed in turn, the
    way GEMM libraries choose a split-K by shape, so a row's bits depend on how many rows share
    the call. Its decoder blocks are the composed ones (`Backend.decoder_block`), so every
    projection, not only the output head, goes through this matmul: the rows of a warm suffix,
    of a prefill chunk and of a mixed batch all come out different from the cold run's."""

    name = "cpu-split-k"

    def matmul(self, x, weight, bias=None):
        if weight.layout is not Layout.ROW_MAJOR_F32:
            return super().matmul(x, weight, bias)
        xs, w = x.raw, weight.raw
        bounds = np.linspace(0, xs.shape[1], xs.shape[0] % 3 + 2).astype(int)
        out = xs[:, : bounds[1]] @ w[:, : bounds[1]].T
        for lo, hi in zip(bounds[1:-1], bounds[2:]):
            out = out + xs[:, lo:hi] @ w[:, lo:hi].T
        return Tensor(out + bias.raw if bias is not None else out)

    def decoder_block(self, h, x, layer, spec, meta, kv, index, next_norm):
        return Backend.decoder_block(self, h, x, layer, spec, meta, kv, index, next_norm)


register(SplitKBackend.name, SplitKBackend, "approx")
VARIANT_FAMILIES = ("warm", "batched", "chunk")


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2")
    tiny_hf_model(folder, "qwen2", seed=3, vocab_size=256, max_position_embeddings=512)
    byte_level_tokenizer(folder)
    return str(folder)


def byte_level_tokenizer(folder) -> None:
    """A 256-token byte-level tokenizer.json so the engine can detokenize the tiny model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))


def make_engine(
    model: str,
    backend: str = "cpu",
    chunk: int = 512,
    prefix_cache: bool = True,
    num_blocks: int = 256,
    kv_dtype: str = "f32",
    activation_dtype: str = "f32",
) -> Engine:
    engine = Engine(
        EngineConfig(
            model=model,
            backend=backend,
            activation_dtype=activation_dtype,
            cache=CacheConfig(num_blocks=num_blocks, enable_prefix_cache=prefix_cache, dtype=kv_dtype),
            scheduler=SchedulerConfig(max_num_batched_tokens=chunk),
        )
    )
    engine.record_logits = True
    return engine


def run(engine: Engine, prompts: dict[str, list[int]], params=GREEDY) -> dict[str, list[np.ndarray]]:
    """Submit all prompts at once, step to completion; request id -> sampled logits rows."""
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            merge_into(outs, out)
    engine.scheduler.check_integrity()
    return {rid: engine.recorded.pop(rid) for rid in prompts}, outs


def rows_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def tokens(n: int, seed: int, vocab: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(3, vocab) for _ in range(n)]


def check_contract(
    model: str,
    backend: str,
    vocab: int,
    prompt_len: int,
    seed: int,
    kv_dtype: str = "f32",
    activation_dtype="f32",
    light: bool = False,
) -> list[str]:
    """Run every variant of the contract with K/V stored as `kv_dtype` and the matmuls taking
    `activation_dtype`; return the names of those that broke it. `light`: one or two variants
    of each family (7 engines instead of 12), for models whose every engine reads a 262k vocab."""
    prompt = tokens(prompt_len, seed, vocab)
    engine_of = functools.partial(make_engine, model, backend, kv_dtype=kv_dtype, activation_dtype=activation_dtype)
    cold = run(engine_of(), {"p": prompt})[0]["p"]
    assert cold and all(row.size for row in cold)
    broken = []
    rnd = random.Random(seed)
    splits = sorted(
        {16, 17, rnd.randrange(2, prompt_len - 1)}
        if light
        else {1, 16, 17, prompt_len - 1, rnd.randrange(2, prompt_len - 1)}
    )
    for split in splits:  # warm: a prefix of the prompt was computed by an earlier request
        engine = engine_of()
        run(engine, {"prefix": prompt[:split]}, SamplingParams(max_tokens=1, temperature=0.0))
        warm, outs = run(engine, {"p": prompt})
        assert outs["p"].cached_len > 0
        if not rows_equal(warm["p"], cold):
            broken.append(f"warm split={split}")
    for others in (1, 7) if light else (1, 3, 7):  # batched with unrelated requests
        batch = {f"o{i}": tokens(rnd.randrange(5, 40), seed + 100 + i, vocab) for i in range(others)}
        got = run(engine_of(), {**batch, "p": prompt})[0]["p"]
        if not rows_equal(got, cold):
            broken.append(f"batched with {others}")
    for chunk in (7,) if light else (1, 7, 64):  # chunked prefill
        got = run(engine_of(chunk=chunk), {"p": prompt})[0]["p"]
        if not rows_equal(got, cold):
            broken.append(f"chunk={chunk}")
    return broken


def test_exact_reuse_tiny_qwen2(qwen2_dir):
    assert check_contract(qwen2_dir, "cpu", 256, 45, seed=1) == []


def test_exact_reuse_tiny_qwen2_reference(qwen2_dir):
    assert check_contract(qwen2_dir, "reference", 256, 37, seed=2) == []


@pytest.mark.slow
def test_exact_reuse_smollm2():
    assert check_contract("smollm2", "cpu", 49152, 40, seed=3) == []


def test_exact_reuse_tiny_qwen2_f16_kv(qwen2_dir):
    # 300 tokens: rows past one 256-key range, so the range merge runs on f16 K/V too
    assert check_contract(qwen2_dir, "cpu", 256, 300, seed=4, kv_dtype="f16") == []


def test_exact_reuse_tiny_qwen2_reference_f16_kv(qwen2_dir):
    assert check_contract(qwen2_dir, "reference", 256, 37, seed=5, kv_dtype="f16") == []


@pytest.mark.slow
def test_exact_reuse_smollm2_f16_kv():
    assert check_contract("smollm2", "cpu", 49152, 40, seed=3, kv_dtype="f16") == []


@pytest.mark.slow
def test_exact_reuse_gemma3_f16_kv():  # head_dim 256 and one kv head: the AVX-512 unit at 4 heads
    assert check_contract("gemma3-270m", "cpu", 262144, 40, seed=3, kv_dtype="f16", light=True) == []


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_control_non_invariant_backend_is_caught_by_every_variant_family(qwen2_dir, kv_dtype):
    broken = check_contract(qwen2_dir, SplitKBackend.name, 256, 45, seed=1, kv_dtype=kv_dtype)
    caught = {name.split()[0].split("=")[0] for name in broken}
    assert caught == set(VARIANT_FAMILIES), (
        f"a non-invariant matmul went unnoticed by {set(VARIANT_FAMILIES) - caught}: those checks cannot fail "
        f"(broken: {broken})"
    )


def agent_conversation(engine: Engine, vocab: int, turns: int = 4) -> list[list[int]]:
    """Greedy multi-turn: each turn's prompt = last prompt + its answer + a tool result."""
    context = tokens(30, 7, vocab)
    answers = []
    for t in range(turns):
        _, outs = run(engine, {f"t{t}": context}, SamplingParams(max_tokens=6, temperature=0.0))
        answers.append(outs[f"t{t}"].token_ids)
        context = context + outs[f"t{t}"].token_ids + tokens(9, 50 + t, vocab)
    return answers


@pytest.mark.parametrize("model,vocab", [("qwen2", 256), ("smollm2", 49152)])
def test_agent_turns_identical_with_cache_on_and_off(model, vocab, qwen2_dir):
    path = qwen2_dir if model == "qwen2" else model
    on = make_engine(path)
    off = make_engine(path, prefix_cache=False)
    assert agent_conversation(on, vocab) == agent_conversation(off, vocab)
    assert on.stats().prefix_hit_tokens > 0 and off.stats().prefix_hit_tokens == 0
