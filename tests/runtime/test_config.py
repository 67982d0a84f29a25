"""The config tree: each knob has one owner field, overrides build the same EngineConfig that
LLM and AsyncEngine load, and a bad value is a ValueError naming field, value and range."""

from __future__ import annotations

import dataclasses

import pytest

from agentkv.runtime.async_engine import AsyncEngine
from agentkv.runtime.config import (
    DEFAULT_BACKEND,
    KNOBS,
    CacheConfig,
    EngineConfig,
    engine_config,
    knob_default,
    knob_field,
    knob_type,
    with_overrides,
)
from agentkv.runtime.engine import Engine
from agentkv.runtime.llm import LLM
from agentkv.runtime.params import SamplingParams
from agentkv.sched import SchedulerConfig
from tests.runtime.test_exactness import qwen2_dir, tokens  # noqa: F401

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)
SECTIONS = (EngineConfig, CacheConfig, SchedulerConfig)


def leaf_fields() -> list[tuple[type, str]]:
    """Every settable leaf of the tree (the sub-config holders and the model are not knobs)."""
    return [
        (cls, f.name)
        for cls in SECTIONS
        for f in dataclasses.fields(cls)
        if f.name not in ("model", "cache", "scheduler")
    ]


def test_every_leaf_field_is_owned_by_exactly_one_knob():
    names = [name for _, name in leaf_fields()]
    assert len(names) == len(set(names)), f"a setting is defined twice: {names}"
    owned = sorted((knob_field(k).name, k) for k in KNOBS)
    assert sorted(f for f, _ in owned) == sorted(names)
    assert {"block_size", "enable_prefix_cache"} <= {f.name for f in dataclasses.fields(CacheConfig)}
    assert not {"block_size", "enable_prefix_cache"} & {f.name for f in dataclasses.fields(SchedulerConfig)}


def test_knob_defaults_and_types_come_from_the_owner():
    assert knob_default("backend") == DEFAULT_BACKEND == EngineConfig(model="m").backend
    assert knob_default("block_size") == CacheConfig().block_size == 16
    assert knob_default("max_num_batched_tokens") == SchedulerConfig().max_num_batched_tokens
    assert knob_default("kv_cache_blocks") is None
    assert (knob_type("chunk_size"), knob_type("enable_prefix_cache"), knob_type("backend")) == (int, bool, str)


def test_overrides_land_on_their_owner_and_nowhere_else():
    got = engine_config(
        "m",
        block_size=32,
        enable_prefix_cache=False,
        kv_cache_blocks=7,
        max_num_seqs=3,
        chunk_size=8,
        backend="reference",
        served_model_name="x",
    )
    want = EngineConfig(
        model="m",
        backend="reference",
        served_model_name="x",
        cache=CacheConfig(block_size=32, num_blocks=7, enable_prefix_cache=False),
        scheduler=SchedulerConfig(max_num_seqs=3, chunk_size=8),
    )
    assert got == want
    assert engine_config("m") == EngineConfig(model="m")
    assert engine_config(want) is want
    # Whole sections apply first, flat knobs then refine them.
    base = EngineConfig(model="m")
    assert with_overrides(base, cache=CacheConfig(num_blocks=9), block_size=8).cache == CacheConfig(
        block_size=8, num_blocks=9
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"block_size": 0}, r"block_size=0 is out of range: allowed an integer \[1, 1024\]"),
        ({"block_size": 2048}, r"block_size=2048 is out of range"),
        ({"block_size": True}, r"block_size=True is out of range"),
        ({"kv_cache_blocks": 0}, r"num_blocks=0 is out of range: allowed None or an integer >= 1"),
        ({"kv_cache_memory": -1}, r"memory_bytes=-1 is out of range"),
        ({"max_model_len": 1}, r"max_model_len=1 is out of range: allowed None or an integer >= 2"),
        ({"weights": "q4"}, r"weights='q4' is not allowed: use 'resident' or 'f32'"),
        ({"kv_cache_dtype": "bf16"}, r"kv_cache_dtype='bf16' is not allowed: use one of 'f32', 'f16'"),
        ({"kv_cache_dtype": None}, r"kv_cache_dtype=None is not allowed"),
        ({"backend": ""}, r"backend='' must be a backend name"),
        ({"enable_prefix_cache": "no"}, r"enable_prefix_cache='no' must be True or False"),
        ({"max_num_seqs": 0}, r"max_num_seqs=0 is out of range: allowed an integer >= 1"),
        ({"chunk_size": 600}, r"chunk_size=600 is out of range: allowed an integer \[1, max_num_batched_tokens=512\]"),
    ],
)
def test_a_bad_value_names_field_value_and_range(overrides, message):
    with pytest.raises(ValueError, match=message):
        engine_config("m", **overrides)


def test_an_unknown_setting_is_named():
    with pytest.raises(TypeError, match="unknown engine setting 'kv_blocks'; known: .*kv_cache_blocks"):
        engine_config("m", kv_blocks=4)


def test_the_engine_gives_the_scheduler_the_cache_configs_knobs(qwen2_dir):  # noqa: F811
    """The scheduler's block size and prefix switch are the cache config's, not a copy's."""
    for block_size, prefix in ((8, False), (32, True)):
        engine = Engine(engine_config(qwen2_dir, block_size=block_size, enable_prefix_cache=prefix, kv_cache_blocks=64))
        assert engine.scheduler.block_size == engine.cache.block_size == block_size
        assert (engine.scheduler.cache is engine.cache) is prefix
        assert engine.runner is not None and engine.num_blocks == 64


def test_llm_takes_a_config_or_the_same_keywords(qwen2_dir):  # noqa: F811
    config = EngineConfig(
        model=qwen2_dir,
        cache=CacheConfig(block_size=8, num_blocks=40),
        scheduler=SchedulerConfig(max_num_batched_tokens=16),
    )
    by_config = LLM(config)
    by_keywords = LLM(qwen2_dir, block_size=8, kv_cache_blocks=40, max_num_batched_tokens=16)
    assert by_config.config == by_keywords.config == config
    assert by_config.engine.config is config
    prompt = tokens(30, 7, 256)
    a, b = by_config.generate([prompt], GREEDY)[0], by_keywords.generate([prompt], GREEDY)[0]
    assert a.token_ids == b.token_ids and len(a.token_ids) == 4
    assert by_keywords.engine.scheduler.block_size == 8
    assert LLM(config, block_size=4).config.cache == CacheConfig(block_size=4, num_blocks=40)


def test_async_engine_from_config_and_from_model_agree(qwen2_dir):  # noqa: F811
    config = engine_config(qwen2_dir, kv_cache_blocks=32, enable_prefix_cache=False, served_model_name="tiny")
    engine = AsyncEngine.from_config(config)
    assert engine.config is config and engine.model_name == "tiny"
    assert engine.engine.scheduler.cache is None
    again = AsyncEngine.from_model(qwen2_dir, kv_cache_blocks=32, enable_prefix_cache=False, served_model_name="tiny")
    assert again.config == config
    with pytest.raises(TypeError, match="needs an EngineConfig, got str"):
        AsyncEngine.from_config(qwen2_dir)
