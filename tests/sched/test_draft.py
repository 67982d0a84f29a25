"""Drafters: prompt lookup, the suffix index, and the adaptive draft length, on exact state."""

from __future__ import annotations

import pytest

from agentkv.sched.draft import DraftLength, GlobalIndex, NgramDrafter, NgramIndex, SuffixDrafter, make_drafter


def test_index_holds_only_ngrams_with_a_continuation():
    index = NgramIndex(2, 3)
    index.extend([1, 2, 3, 1, 2])
    assert index.ends == {(1, 2): 2, (2, 3): 3, (1, 2, 3): 3, (3, 1): 4, (2, 3, 1): 4}
    index.extend([3])  # (1, 2) now ends at 5 as well: the latest occurrence wins
    assert index.ends[(1, 2)] == 5 and index.ends[(3, 1, 2)] == 5


def test_prompt_lookup_takes_the_longest_then_the_latest_match():
    drafter = NgramDrafter(min_n=1, max_n=3)
    #          0  1  2  3  4   5  6  7  8   9  10 11
    context = [5, 6, 7, 8, 9, 6, 7, 40, 41, 5, 6, 7]
    # "5 6 7" (n=3) occurs at 0..2 followed by 8 9; "6 7" alone later is followed by 40.
    assert drafter.propose("r", context, 4) == [8, 9, 6, 7]
    context2 = [1, 2, 9, 3, 2, 8, 4, 2]  # only n=1 matches: the latest "2" is followed by 8
    assert drafter.propose("q", context2, 2) == [8, 4]
    assert drafter.propose("z", [1, 2, 3], 4) == []  # nothing repeats
    assert drafter.propose("r", context, 0) == []


def test_prompt_lookup_is_incremental_and_rebuilds_on_a_foreign_context():
    drafter = NgramDrafter(min_n=2, max_n=2)
    assert drafter.propose("r", [1, 2, 3], 2) == []
    assert drafter.propose("r", [1, 2, 3, 1, 2], 2) == [3, 1]
    assert len(drafter._own["r"].tokens) == 5
    assert drafter.propose("r", [7, 8, 7, 8], 1) == [7]  # not an extension: rebuilt
    assert drafter._own["r"].tokens == [7, 8, 7, 8]
    drafter.end("r", [7, 8, 7, 8])
    assert "r" not in drafter._own


def test_global_index_is_bounded_and_evicts_oldest_with_its_entries():
    index = GlobalIndex(2, 2, max_tokens=8)
    index.add([1, 2, 3, 4])
    index.add([5, 6, 7, 8])
    assert index.match([0, 1, 2], 2) == (2, [3, 4])
    index.add([9, 10, 11])  # 11 tokens > 8: the first document leaves
    assert list(index.docs) == [1, 2] and index.num_tokens == 7
    assert index.match([1, 2], 2) == (0, [])
    assert all(doc != 0 for doc, _ in index.ends.values())
    assert index.match([5, 6], 3) == (2, [7, 8])


def test_suffix_drafter_prefers_the_longer_match_and_own_context_on_ties():
    drafter = SuffixDrafter(min_n=2, max_n=4, max_indexed_tokens=100)
    drafter.end("old", [10, 11, 12, 13, 14, 15])
    # own context matches "12 13" (n=2); the global index matches "11 12 13" (n=3)
    assert drafter.propose("r", [12, 13, 99, 11, 12, 13], 2) == [14, 15]
    # equal length 2: the request's own continuation wins
    assert drafter.propose("s", [12, 13, 77, 12, 13], 2) == [77, 12]
    assert drafter.propose("t", [1, 2, 3], 2) == []


def test_registry_names_and_refuses_unknown():
    assert isinstance(make_drafter("ngram"), NgramDrafter)
    assert isinstance(make_drafter("suffix"), SuffixDrafter)
    with pytest.raises(ValueError, match="'eagle' is not a drafter"):
        make_drafter("eagle")


def test_draft_length_falls_to_zero_then_probes_with_growing_pauses():
    length = DraftLength(8)
    seen = []
    for _ in range(4):  # wholly rejected drafts halve it: 8 4 2 1
        k = length.next()
        seen.append(k)
        length.update(k, 0)
    assert seen == [8, 4, 2, 1] and length.length == 0
    pattern = []
    for _ in range(12):  # probes of one token, each missing: pauses of 1, 2, 4 steps
        k = length.next()
        pattern.append(k)
        length.update(k, 0)
    assert pattern == [0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    while length.next() == 0:
        pass
    length.update(1, 1)  # a hit: recovers slowly, one token more per full acceptance
    assert length.length == 2 and length.next() == 2
    length.update(2, 2)
    assert length.length == 3
    length.update(3, 1)  # partly accepted: kept
    assert length.length == 3
    length.update(3, 0)  # wholly rejected: halved
    assert length.length == 1


def test_draft_length_never_exceeds_its_limit_and_zero_limit_never_drafts():
    length = DraftLength(3)
    for _ in range(5):
        length.update(length.next(), length.next())
    assert length.length == 3
    off = DraftLength(0)
    assert [off.next() for _ in range(5)] == [0] * 5
    with pytest.raises(ValueError):
        length.update(2, 3)
