"""SamplingParams: normalisation of JSON-shaped input and one rejection test per bounded field."""

from __future__ import annotations

import dataclasses

import pytest

from agentkv.runtime.params import SamplingParams


def test_defaults_match_openai() -> None:
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (16, 1.0, 1.0, 0, 0.0)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.0, 0.0, 0.0)
    assert p.logit_bias == () and p.stop == () and p.stop_token_ids == ()
    assert p.seed is None and p.logprobs is None and p.prompt_logprobs is None
    assert (p.ignore_eos, p.include_stop_str_in_output, p.skip_special_tokens, p.n) == (False, False, True, 1)
    assert not p.greedy


def test_field_names_are_the_contract() -> None:
    names = [f.name for f in dataclasses.fields(SamplingParams)]
    assert names == [
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "prompt_logprobs",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "n",
        "speculative",
        "logit_token_ids",
    ]


def test_frozen_and_slotted() -> None:
    p = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert not hasattr(p, "__dict__")


def test_logit_bias_dict_is_sorted_tuple_and_digit_keys_become_ints() -> None:
    p = SamplingParams(logit_bias={"50": -100, 7: 2.5, 3: 0})  # type: ignore[arg-type]
    assert p.logit_bias == ((3, 0.0), (7, 2.5), (50, -100.0))
    assert all(isinstance(b, float) for _, b in p.logit_bias)
    assert SamplingParams.create(logit_bias={"50": -100, 7: 2.5, 3: 0}) == p
    assert hash(p) == hash(SamplingParams(logit_bias=((50, -100.0), (3, 0.0), (7, 2.5))))


def test_stop_str_and_lists_become_tuples() -> None:
    assert SamplingParams(stop="END").stop == ("END",)  # type: ignore[arg-type]
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")  # type: ignore[arg-type]
    assert SamplingParams(stop_token_ids=[2, 5]).stop_token_ids == (2, 5)  # type: ignore[arg-type]
    assert SamplingParams(stop=["a", "bcd"]).max_stop_len == 3  # type: ignore[arg-type]


def test_int_floats_become_floats() -> None:
    p = SamplingParams(temperature=0, top_p=1)
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)


@pytest.mark.parametrize(
    "kw, greedy",
    [
        ({"temperature": 0.0}, True),
        ({"top_k": 1}, True),
        ({"temperature": 0.7}, False),
        ({"top_k": 2}, False),
        ({"top_k": -1}, False),
    ],
)
def test_greedy(kw: dict, greedy: bool) -> None:
    assert SamplingParams(**kw).greedy is greedy


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("temperature", -0.01),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", -0.5),
        ("top_k", -2),
        ("top_k", 2.0),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.01),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("logprobs", -1),
        ("logprobs", 21),
        ("prompt_logprobs", 21),
        ("prompt_logprobs", -1),
        ("n", 0),
        ("seed", 1.5),
        ("seed", "7"),
        ("seed", 2**64),
    ],
)
def test_out_of_range_names_field_and_value(name: str, value: object) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**{name: value})
    message = str(info.value)
    assert name in message and repr(value) in message


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", 0.0),
        ("temperature", 5.0),
        ("top_p", 1.0),
        ("top_p", 1e-9),
        ("top_k", -1),
        ("top_k", 0),
        ("top_k", 100000),
        ("min_p", 0.0),
        ("min_p", 1.0),
        ("repetition_penalty", 1e-3),
        ("presence_penalty", -2.0),
        ("presence_penalty", 2.0),
        ("frequency_penalty", -2.0),
        ("frequency_penalty", 2.0),
        ("logprobs", 0),
        ("logprobs", 20),
        ("prompt_logprobs", 0),
        ("n", 8),
        ("seed", 0),
        ("seed", -5),
        ("seed", 2**64 - 1),
        ("max_tokens", 1),
    ],
)
def test_boundary_values_accepted(name: str, value: object) -> None:
    assert getattr(SamplingParams(**{name: value}), name) == value


def test_range_is_in_message() -> None:
    with pytest.raises(ValueError, match=r"top_p=1\.5 .*\(0, 1\]"):
        SamplingParams(top_p=1.5)


@pytest.mark.parametrize("bias", [{5: 100.5}, {5: -101}, {5: float("nan")}])
def test_logit_bias_value_out_of_range(bias: dict) -> None:
    with pytest.raises(ValueError, match=r"logit_bias\[5\]") as info:
        SamplingParams(logit_bias=bias)  # type: ignore[arg-type]
    assert repr(float(bias[5])) in str(info.value) or "nan" in str(info.value)


@pytest.mark.parametrize("bias", [{-1: 1.0}, {"x": 1.0}, {1.5: 1.0}])
def test_logit_bias_bad_key(bias: dict) -> None:
    with pytest.raises(ValueError, match="logit_bias key") as info:
        SamplingParams(logit_bias=bias)  # type: ignore[arg-type]
    assert repr(next(iter(bias))) in str(info.value)


def test_logit_bias_duplicate_key() -> None:
    with pytest.raises(ValueError, match="given twice"):
        SamplingParams(logit_bias={"5": 1.0, 5: 2.0})  # type: ignore[arg-type]


@pytest.mark.parametrize("stop", [[""], ["ok", ""], [3]])
def test_stop_strings_non_empty(stop: list) -> None:
    with pytest.raises(ValueError, match="stop") as info:
        SamplingParams(stop=stop)  # type: ignore[arg-type]
    assert repr(stop[-1]) in str(info.value)


@pytest.mark.parametrize("ids", [[-1], [1, "2"], [True]])
def test_stop_token_ids_are_non_negative_ints(ids: list) -> None:
    with pytest.raises(ValueError, match="stop_token_ids") as info:
        SamplingParams(stop_token_ids=ids)  # type: ignore[arg-type]
    assert repr(ids[-1]) in str(info.value)


@pytest.mark.parametrize("name", ["ignore_eos", "include_stop_str_in_output", "skip_special_tokens"])
def test_bool_flags_must_be_bools(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: 1})


def test_non_number_float_field_names_range() -> None:
    with pytest.raises(ValueError, match=r"top_p='0.5' .*\(0, 1\]"):
        SamplingParams(top_p="0.5")  # type: ignore[arg-type]


def test_check_vocab() -> None:
    params = SamplingParams(logit_bias={99: 1.0})
    params.check_vocab(100)
    with pytest.raises(ValueError, match=r"logit_bias key=100 .*\[0, 99\]"):
        SamplingParams(logit_bias={100: 1.0}).check_vocab(100)


def test_none_collections_mean_empty() -> None:
    p = SamplingParams(stop=None, stop_token_ids=None, logit_bias=None)  # type: ignore[arg-type]
    assert (p.stop, p.stop_token_ids, p.logit_bias) == ((), (), ())


def test_speculative_opt_out_must_be_a_bool() -> None:
    assert SamplingParams().speculative is True and SamplingParams(speculative=False).speculative is False
    with pytest.raises(ValueError, match="speculative=1 must be a bool"):
        SamplingParams(speculative=1)


def test_logit_token_ids_are_reported_with_logprobs_and_checked_against_the_vocab() -> None:
    assert SamplingParams(logprobs=0, logit_token_ids=[7, 3]).logit_token_ids == (7, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logit_token_ids are reported with the logprobs"):
        SamplingParams(logit_token_ids=(7,))
    with pytest.raises(ValueError, match="logit_token_ids=-1 is out of range"):
        SamplingParams(logprobs=0, logit_token_ids=(-1,))
    with pytest.raises(ValueError, match=r"logit_token_ids=9 is out of range: allowed token ids in \[0, 8\]"):
        SamplingParams(logprobs=0, logit_token_ids=(9,)).check_vocab(9)
