"""MinTokensConstraint: EOS and stop ids are masked until min_tokens tokens are out."""

from __future__ import annotations

import numpy as np

from agentkv.runtime.structured import MinTokensConstraint


class Fixed:
    """A stand-in grammar that always allows the same ids (the wrapper's inner interface)."""

    def __init__(self, allowed: list[int], vocab: int) -> None:
        self.mask = np.zeros(vocab, dtype=bool)
        self.mask[allowed] = True
        self.accepted: list[int] = []

    def allowed_mask(self) -> np.ndarray:
        return self.mask

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def is_finished(self) -> bool:
        return False


def test_bans_until_min_tokens_then_frees():
    c = MinTokensConstraint(None, [0, 5], 8, 2)
    for token in (3, 4):
        mask = c.allowed_mask()
        assert mask.tolist() == [False, True, True, True, True, False, True, True]
        c.accept(token)
    assert c.allowed_mask() is None and not c.is_finished()


def test_with_a_grammar_both_apply_and_the_grammar_wins_a_deadlock():
    inner = Fixed([0, 1], 4)
    c = MinTokensConstraint(inner, [0], 4, 2)
    assert c.allowed_mask().tolist() == [False, True, False, False]
    c.accept(1)
    inner.mask[:] = [True, False, False, False]  # the grammar may only end now
    assert c.allowed_mask().tolist() == [True, False, False, False]
    c.accept(0)
    assert inner.accepted == [1, 0] and c.allowed_mask() is inner.mask
