"""The engine flags come from the config tree: one flag per knob, defaults equal to the
dataclass defaults, and a bad value is the config's own error with exit status 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from agentkv.commands import chat, generate, serve
from agentkv.commands.config_flags import FLAGS, add_engine_arguments, config_from_args
from agentkv.runtime.config import KNOBS, CacheConfig, EngineConfig, knob_default
from agentkv.sched import SchedulerConfig

AGENTKV = [sys.executable, "-m", "agentkv.cli"]


def parser_of(module) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return p


def parse(module, *argv: str) -> argparse.Namespace:
    extra = ["hi"] if module is generate else []
    return parser_of(module).parse_args(["m", *extra, *argv])


def test_every_knob_has_one_flag():
    assert FLAGS.keys() == KNOBS.keys()
    assert len({f.flag for f in FLAGS.values()}) == len(FLAGS)


@pytest.mark.parametrize("module", [serve, generate, chat])
def test_flag_defaults_are_the_dataclass_defaults(module):
    args = parse(module)
    for knob in FLAGS:
        if hasattr(args, knob):
            assert getattr(args, knob) == knob_default(knob), knob
    assert config_from_args(args) == EngineConfig(model="m")


def test_serve_has_every_knob_and_the_offline_commands_all_but_the_serving_ones():
    assert set(FLAGS) <= set(vars(parse(serve)))
    for module in (generate, chat):
        assert set(FLAGS) - set(vars(parse(module))) == {
            "served_model_name",
            "max_queued_requests",
            "stream_stall_timeout",
            "max_pinned_blocks",
            "max_pinned_blocks_per_tenant",
        }


def test_flags_build_the_config_they_name():
    args = parse(
        serve,
        "--backend",
        "reference",
        "--weights",
        "f32",
        "--max-model-len",
        "256",
        "--served-model-name",
        "x",
        "--block-size",
        "32",
        "--no-prefix-cache",
        "--kv-cache-memory",
        "512MiB",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "128",
        "--chunk-size",
        "64",
    )
    assert config_from_args(args) == EngineConfig(
        model="m",
        backend="reference",
        weights="f32",
        max_model_len=256,
        served_model_name="x",
        cache=CacheConfig(block_size=32, memory_bytes=512 << 20, enable_prefix_cache=False),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, chunk_size=64),
    )
    assert config_from_args(parse(generate, "--kv-cache-blocks", "9")).cache.num_blocks == 9


@pytest.mark.parametrize("module", [serve, generate, chat])
def test_kv_cache_dtype_flag(module, capsys):
    assert config_from_args(parse(module, "--kv-cache-dtype", "f32")).cache.dtype == "f32"
    assert config_from_args(parse(module)).cache.dtype == "f16"  # the default
    with pytest.raises(SystemExit) as exit_info:
        parse(module, "--kv-cache-dtype", "bf16")
    assert exit_info.value.code == 2
    assert "argument --kv-cache-dtype: invalid choice: 'bf16'" in capsys.readouterr().err


def test_kv_size_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(serve, "--kv-cache-blocks", "9", "--kv-cache-memory", "1GiB")
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_size_is_reported_word_for_word(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(generate, "--kv-cache-memory", "12XB")
    assert exit_info.value.code == 2
    assert "cannot read size '12XB'; use e.g. 512MiB" in capsys.readouterr().err


def test_a_subset_of_knobs_and_no_positional_model():
    p = argparse.ArgumentParser()
    add_engine_arguments(p, knobs=("weights", "kv_cache_blocks"), model_positional=False)
    args = p.parse_args(["--weights", "f32"])
    assert set(vars(args)) == {"weights", "kv_cache_blocks"}
    assert config_from_args(args, model="smollm2") == EngineConfig(model="smollm2", weights="f32")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ("generate", "smollm2", "hi", "--block-size", "0"),
            "block_size=0 is out of range: allowed an integer [1, 1024]",
        ),
        (("chat", "smollm2", "--max-num-seqs", "0"), "max_num_seqs=0 is out of range: allowed an integer >= 1"),
        (
            ("serve", "smollm2", "--chunk-size", "1000"),
            "chunk_size=1000 is out of range: allowed an integer [1, max_num_batched_tokens=512]",
        ),
    ],
)
def test_a_bad_flag_value_is_the_configs_error_and_exit_2(argv, message):
    r = subprocess.run([*AGENTKV, *argv], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
