"""Conversation programs (`ws_mode.testing._program`): `conversations()` draws from the pools
it is given and refuses pools that could not make valid requests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ws_mode.testing import DEFAULT_LANES, Conversation, Step, conversations


@settings(max_examples=50)
@given(program=conversations(lanes=(None,), instructions=("Hi.",), warm_ups=False, max_steps=3))
def test_conversations_draws_from_the_pools(program: Conversation) -> None:
    assert 1 <= len(program) <= 3
    for step in program.steps:
        assert step.lane is None
        assert step.instructions == "Hi."
        assert step.generate
        assert step.form != "empty"
        assert step.describe()


@given(data=st.data())
def test_conversations_rejects_bad_pools(data: st.DataObject) -> None:
    bad: dict[str, Any] = data.draw(
        st.sampled_from(
            [
                {"lanes": ("no spaces",)},
                {"fields": ({"input": "x"},)},
                {"models": ()},
                {"min_steps": 0},
                {"tools": ()},
            ]
        )
    )
    with pytest.raises(ValueError):  # noqa: PT011
        conversations(**bad)
    assert None in DEFAULT_LANES


@pytest.mark.parametrize(
    ("fields", "lane"),
    [({"stream_id": "x"}, None), ({"generate": False}, None), ({}, "a b"), ({}, "x" * 257)],
)
def test_a_step_refuses_socket_only_fields_and_bad_lanes(
    fields: dict[str, object], lane: str | None
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        Step(fields=fields, lane=lane)
