"""StopChecker: token stops, stop strings across token boundaries, trimming, holdback, length."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.runtime.params import SamplingParams
from agentkv.runtime.stop import RUNNING, StopChecker, StopDecision

EOS = 2


def _feed(checker: StopChecker, pieces: list[str], token_ids: list[int] | None = None) -> tuple[str, StopDecision, int]:
    """Feed text pieces one token at a time; return (text, first finishing decision, step)."""
    text = ""
    for step, piece in enumerate(pieces):
        text += piece
        token_id = token_ids[step] if token_ids else 100 + step
        decision = checker.check(token_id, piece)
        if decision.finished:
            return text, decision, step
    return text, RUNNING, len(pieces)


def test_running_until_max_tokens_then_length() -> None:
    checker = StopChecker(SamplingParams(max_tokens=3), {EOS})
    assert checker.check(10, "a") == RUNNING
    assert checker.check(11, "b") == RUNNING
    assert checker.check(12, "c") == StopDecision(True, "length", None, None)


def test_eos_stops_unless_ignore_eos() -> None:
    assert StopChecker(SamplingParams(), {EOS, 7}).check(7, "x") == StopDecision(True, "stop", None, 7)
    ignoring = StopChecker(SamplingParams(ignore_eos=True, max_tokens=5), {EOS})
    assert ignoring.check(EOS, "x") == RUNNING


def test_stop_token_ids_stop_even_with_ignore_eos() -> None:
    checker = StopChecker(SamplingParams(stop_token_ids=(9,), ignore_eos=True), {EOS})
    assert checker.check(9, "x") == StopDecision(True, "stop", None, 9)


def test_stop_beats_length_on_the_last_token() -> None:
    checker = StopChecker(SamplingParams(max_tokens=1), {EOS})
    assert checker.check(EOS, "") == StopDecision(True, "stop", None, EOS)
    strings = StopChecker(SamplingParams(max_tokens=1, stop=("a",)), {EOS})
    assert strings.check(5, "xa") == StopDecision(True, "stop", 1, "a")


def test_stop_string_across_token_boundaries_is_trimmed() -> None:
    checker = StopChecker(SamplingParams(stop=("</tool>",), max_tokens=100), {EOS})
    text, decision, step = _feed(checker, ["call(", "x)</", "to", "ol>", "tail"])
    assert step == 3
    assert decision == StopDecision(True, "stop", 7, "</tool>")
    assert text[: decision.trim_text_to] == "call(x)"


def test_include_stop_str_in_output() -> None:
    params = SamplingParams(stop=("</tool>",), include_stop_str_in_output=True)
    text, decision, _ = _feed(StopChecker(params, {EOS}), ["call(x)</", "tool>more"])
    assert text[: decision.trim_text_to] == "call(x)</tool>"


def test_stop_string_inside_one_token_with_text_after_it() -> None:
    checker = StopChecker(SamplingParams(stop=("\n\n",)), {EOS})
    text, decision, step = _feed(checker, ["ab", "c\n\nd"])
    assert (step, text[: decision.trim_text_to], decision.matched) == (1, "abc", "\n\n")


def test_earliest_completed_stop_string_wins() -> None:
    # "bc" completes at index 3, "abcd" at 5: a char-by-char check stops at "bc".
    checker = StopChecker(SamplingParams(stop=("abcd", "bc")), {EOS})
    decision = checker.check(5, "xabcd")
    assert decision == StopDecision(True, "stop", 2, "bc")
    # same end: the earlier start (the longer string) is trimmed
    tie = StopChecker(SamplingParams(stop=("bc", "abc")), {EOS})
    assert tie.check(5, "xabc") == StopDecision(True, "stop", 1, "abc")


def test_a_match_needs_every_char_fed() -> None:
    checker = StopChecker(SamplingParams(stop=("END",), max_tokens=10), {EOS})
    assert checker.check(5, "EN") == RUNNING and checker.holdback_len() == 2
    assert checker.check(6, "d END") == StopDecision(True, "stop", 4, "END")  # "ENd" is no match


def test_a_step_costs_the_same_however_long_the_text_before_it() -> None:
    """The checker keeps one state per stop string, not the text: feeding 200,000 characters
    leaves it no bigger, and a stop string still completes across the last boundary."""
    checker = StopChecker(SamplingParams(stop=("</tool>",), max_tokens=10**6), {EOS})
    for i in range(20_000):
        assert checker.check(100 + i, "abcdefg</t") == RUNNING
    assert checker.holdback_len() == 3 and checker.num_chars == 200_000
    assert checker.check(7, "ool>") == StopDecision(True, "stop", 200_000 - 3, "</tool>")


def test_empty_new_text_never_matches() -> None:
    checker = StopChecker(SamplingParams(stop=("x",), max_tokens=10), {EOS})
    assert checker.check(5, "") == RUNNING


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", 0),
        ("hello", 0),
        ("hello <", 1),
        ("hello </to", 4),
        ("hello </tool", 6),
        ("</tx", 0),
        ("x\n", 1),
        ("<</", 2),
    ],
)
def test_holdback_len(text: str, expected: int) -> None:
    checker = StopChecker(SamplingParams(stop=("</tool>", "\n\n"), max_tokens=100), {EOS})
    for i, c in enumerate(text):  # one character a token
        assert checker.check(100 + i, c) == RUNNING
    assert checker.holdback_len() == expected


def test_holdback_without_stop_strings_is_zero() -> None:
    checker = StopChecker(SamplingParams(), {EOS})
    checker.check(5, "anything")
    assert checker.holdback_len() == 0


PIECE = st.text(alphabet="ab<>/x", min_size=0, max_size=4)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(PIECE, min_size=1, max_size=12))
def test_streamed_deltas_never_show_a_partial_stop_string(pieces: list[str]) -> None:
    """Stream with holdback; the concatenated deltas equal the trimmed final text, and a
    stop is found at the same place however the text is cut into tokens."""
    params = SamplingParams(stop=("</a>", "bb"), max_tokens=100)
    checker = StopChecker(params, {EOS})
    text, decision, _ = _feed(checker, pieces)
    sent = ""
    streamer = StopChecker(params, {EOS})
    text2 = ""
    for piece in pieces:
        text2 += piece
        d = streamer.check(1, piece)
        if d.finished:
            sent += text2[len(sent) : d.trim_text_to]
            break
        visible = len(text2) - streamer.holdback_len()
        assert visible >= len(sent)
        sent += text2[len(sent) : visible]
    else:
        sent += text2[len(sent) :]
    expected = text if not decision.finished else text[: decision.trim_text_to]
    assert sent == expected
    whole = "".join(pieces)
    found = [(i + len(s), i) for s in params.stop if (i := whole.find(s)) >= 0]
    assert decision.finished == bool(found)
    if found:
        assert decision.trim_text_to == min(found)[1]  # first to complete, then earliest start
