"""The connection's send gate: one send at a time on the socket, in order, whatever the
lanes and cancellations do (`ws_mode._connection._SendGate`, taken once per event); and its
close, whose frame a peer that stopped reading may never take."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._asgi import Message
from ws_mode._connection import Connection, _SendGate


async def _take(gate: _SendGate) -> None:
    if gate.held:
        await gate.wait()
    else:
        gate.held = True


def _give_back(gate: _SendGate) -> None:
    if gate.waiters:
        gate.release()
    else:
        gate.held = False


@pytest.mark.anyio
async def test_sends_never_overlap_and_keep_their_order() -> None:
    gate = _SendGate()
    inside = 0
    order: list[int] = []

    async def send(number: int) -> None:
        nonlocal inside
        await _take(gate)
        try:
            inside += 1
            assert inside == 1
            order.append(number)
            await asyncio.sleep(0)  # a send that suspends (the socket's buffer is full)
            await asyncio.sleep(0)
        finally:
            inside -= 1
            _give_back(gate)

    await asyncio.gather(*(send(number) for number in range(20)))
    assert order == list(range(20))
    assert not gate.held
    assert not gate.waiters


@pytest.mark.anyio
async def test_a_waiter_cancelled_while_waiting_is_skipped() -> None:
    gate = _SendGate()
    await _take(gate)
    cancelled = asyncio.create_task(_take(gate))
    after = asyncio.create_task(_take(gate))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    _give_back(gate)  # hands the gate to `after`, past the cancelled waiter
    await asyncio.wait_for(after, 10)  # a hang, not a speed
    assert gate.held
    _give_back(gate)
    assert not gate.held
    assert cancelled.cancelled()


@pytest.mark.anyio
async def test_a_waiter_cancelled_as_it_is_handed_the_gate_passes_it_on() -> None:
    gate = _SendGate()
    await _take(gate)
    first = asyncio.create_task(_take(gate))
    second = asyncio.create_task(_take(gate))
    await asyncio.sleep(0)
    _give_back(gate)  # `first` is handed the gate...
    first.cancel()  # ...and cancelled before it runs
    await asyncio.wait_for(second, 10)  # so it goes on to `second` (10 s: a hang)
    assert first.cancelled()
    assert gate.held
    _give_back(gate)
    assert not gate.held
    assert not gate.waiters


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("no turn runs here")


@pytest.mark.anyio
async def test_sending_the_close_frame_is_bounded_by_close_timeout_seconds() -> None:
    # Longer than the 1 s default: a timeout never fires early, so the wait shows the bound.
    middleware = WebSocketModeMiddleware(_no_app, limits=Limits(close_timeout_seconds=1.5))
    sent: list[Message] = []

    async def receive() -> Message:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)
        await asyncio.Event().wait()  # a peer that never takes the frame

    scope = {"type": "websocket", "path": "/v1/responses", "headers": []}
    connection = Connection(middleware.settings, scope, receive, send)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(connection.drain(0.0), 10)  # 10 s: a hang, not a speed
    elapsed = loop.time() - started
    assert [message["type"] for message in sent] == ["websocket.close"]
    # The bound set, not the 1 s default (asyncio may fire a timer up to its clock's resolution
    # early); wait_for above stands for "not forever", so no upper bound a busy machine breaks.
    assert elapsed >= 1.5 - 0.005
