"""Tokens views share one append-only buffer along a chain and copy only at forks."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from ws_mode._tokens import Tokens

token_lists = st.lists(st.integers(0, 2**32 - 1), max_size=6)


class SharedBuffers(RuleBasedStateMachine):
    """Extending any view, in any order, never changes what an older view holds."""

    views = Bundle("views")

    def __init__(self) -> None:
        super().__init__()
        self.model: list[tuple[Tokens, list[int]]] = []

    @rule(target=views, first=token_lists)
    def start(self, first: list[int]) -> tuple[Tokens, list[int]]:
        view = Tokens().extended(first)
        self.model.append((view, first))
        return view, first

    @rule(target=views, parent=views, parts=st.lists(token_lists, max_size=3))
    def extend(
        self, parent: tuple[Tokens, list[int]], parts: list[list[int]]
    ) -> tuple[Tokens, list[int]]:
        view, expected = parent
        child = view.extended(*parts)
        child_expected = expected + [token for part in parts for token in part]
        self.model.append((child, child_expected))
        return child, child_expected

    @invariant()
    def every_view_holds_its_own_tokens(self) -> None:
        for view, expected in self.model:
            assert len(view) == len(expected)
            assert view.tolist() == expected
            assert list(view) == expected
            assert view == expected


TestSharedBuffers = SharedBuffers.TestCase
# A fork needs three steps and the invariant checks every view after each one (quadratic in
# the steps): 50 runs of 30 steps reach forks of forks, grown and copied, in any order.
TestSharedBuffers.settings = settings(max_examples=50, stateful_step_count=30)


def test_the_newest_view_grows_in_place_and_a_fork_copies() -> None:
    root = Tokens().extended([1, 2])
    child = root.extended([3])
    assert child._buffer is root._buffer  # grown in place
    fork = root.extended([9])
    assert fork._buffer is not root._buffer  # copied at the fork
    assert (root.tolist(), child.tolist(), fork.tolist()) == ([1, 2], [1, 2, 3], [1, 2, 9])


def test_indexing_and_slicing() -> None:
    view = Tokens().extended([5, 6, 7, 8]).extended([])
    shorter = Tokens(view._buffer, 2)
    assert shorter[0] == 5
    assert shorter[-1] == 6
    assert shorter[:] == [5, 6]
    assert view[1:3] == [6, 7]
    with pytest.raises(IndexError):
        shorter[2]
    with pytest.raises(IndexError):
        shorter[-3]
