"""The per-turn microbenchmark (`ws_mode.toolkit.bench.turns`): it runs its turns through the
middleware and reports a positive cost per turn, for both ways of serving the handler.

No test asserts a time: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.bench.turns import (
    CHAIN_TURNS,
    TURN_PATH,
    TurnHandler,
    drive_turns,
    turn_cost_in_process,
)


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_turn_cost_in_process_is_positive(full_context: Literal["always", "on_miss"]) -> None:
    costs = turn_cost_in_process(60, repeat=2, full_context=full_context)
    assert len(costs) == 2
    assert all(cost > 0 for cost in costs)


@pytest.mark.parametrize(("full_context", "whole"), [("always", True), ("on_miss", False)])
def test_its_turns_run_in_short_chains(
    full_context: Literal["always", "on_miss"], whole: bool
) -> None:
    """Every turn reached the handler and was answered; a fresh conversation every
    `CHAIN_TURNS` turns, the others continuing from the cached response (with the whole
    context, or only the new input and `previous_response_id`)."""
    handler = TurnHandler()
    app = WebSocketModeMiddleware(handler, path=TURN_PATH, full_context=full_context)
    assert asyncio.run(drive_turns(app, handler, 2 * CHAIN_TURNS)) >= 0
    assert len(handler.bodies) == handler.turns == 2 * CHAIN_TURNS
    continued = [b'"previous_response_id"' in body for body in handler.bodies]
    expected = [number % CHAIN_TURNS != 0 and not whole for number in range(2 * CHAIN_TURNS)]
    assert continued == expected
