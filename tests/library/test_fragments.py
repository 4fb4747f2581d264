"""Messages sent in fragments (frames without FIN) to ws_mode's protocol
(`BatchingWebSocketProtocol`, under uvicorn): what the fragments of a message still arriving
hold is counted in the middleware's memory budget as they come, and let go when the message
ends or the client leaves; a fragment the budget cannot hold drops the message at once (the
rest is let go as it arrives), and the message is answered `server_is_overloaded`, the
socket and its cached responses kept. Before, the fragments were held outside the budget, up to
the message size limit per socket, however small they were on the wire (permessage-deflate);
tests/library/test_memory_frames.py measures that as RSS.

A message sent whole in one compressed frame (permessage-deflate) is inflated in steps, each
reserved before the next is made: one the budget cannot hold is dropped as it inflates and
answered the same way, and the client's compression context stays in step with the server's, so
the messages that follow inflate as they should (with context takeover, and without)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory

from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._budget import INFLATE_STEP, MemoryBudget
from ws_mode.toolkit.reference import ReferenceConfig, create_app

MiB = 1024 * 1024
#: A bound on what must not hang (never a speed).
HANG = 20.0
FRAGMENT = 2 * MiB


def middleware(limit: int = 256 * MiB) -> WebSocketModeMiddleware:
    """The reference app behind the middleware; the default `limit` holds the parse of a whole
    message of a few fragments (`_budget.PARSE_FACTOR` times it)."""
    return WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=0)), limits=Limits(max_memory_bytes=limit)
    )


def pieces(event: dict[str, Any], padding: int) -> list[str]:
    """`event` with a `padding` field of `padding` characters, as text cut in FRAGMENT-sized
    pieces."""
    text = json.dumps({**event, "padding": "x" * padding})
    return [text[start : start + FRAGMENT] for start in range(0, len(text), FRAGMENT)]


class Fragmented:
    """Sends one message in fragments: every piece but the last at once, the last only when
    `finish()` is called (the message stays unfinished until then)."""

    def __init__(self, socket: ClientConnection, parts: list[str]) -> None:
        self.parts = parts
        self.finishing = asyncio.Event()
        self.sending = asyncio.create_task(socket.send(self._fragments()))

    async def _fragments(self) -> AsyncIterator[str]:
        for part in self.parts[:-1]:
            yield part
        await self.finishing.wait()
        yield self.parts[-1]

    async def finish(self) -> None:
        self.finishing.set()
        await asyncio.wait_for(self.sending, HANG)


async def until(condition: Callable[[], bool]) -> None:
    """Poll `condition` (the server's state, in its thread) until it holds, at most HANG s."""
    for _ in range(int(HANG / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never came to hold")


async def terminal(socket: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(await asyncio.wait_for(socket.recv(), HANG))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


def ws_url(base_url: str) -> str:
    return base_url.replace("http", "ws", 1) + "/v1/responses"


@pytest.mark.anyio
async def test_a_fragmented_create_is_answered_as_the_whole_message_would_be() -> None:
    app = middleware()
    create = {"type": "response.create", "model": "reference", "input": "Say hi."}
    with serve(app) as base_url:
        async with connect(ws_url(base_url), max_size=None) as socket:
            sending = Fragmented(socket, pieces(create, 3 * FRAGMENT))
            await sending.finish()
            answer = await terminal(socket)
    assert answer["type"] == "response.completed", answer


@pytest.mark.anyio
async def test_fragments_are_counted_while_their_message_arrives_and_let_go_when_it_ends() -> None:
    app = middleware()
    budget: MemoryBudget = app.settings.budget
    # An event nothing caches: once answered, nothing of it is held.
    unknown = {"type": "response.nothing_known"}
    with serve(app) as base_url:
        async with connect(ws_url(base_url), max_size=None) as socket:
            await until(lambda: budget.held > 0)  # the socket's own reservation
            before = budget.held
            parts = pieces(unknown, 3 * FRAGMENT)
            sending = Fragmented(socket, parts)
            arrived = sum(len(part) for part in parts[:-1])
            await until(lambda: budget.held - before >= arrived)
            await sending.finish()
            answer = await terminal(socket)
            assert answer["error"]["code"] == "unknown_event_type", answer
            await until(lambda: budget.held == before)
    assert budget.refusals == 0


@pytest.mark.anyio
async def test_a_fragment_the_budget_cannot_hold_drops_its_message_and_keeps_the_socket() -> None:
    app = middleware(limit=5 * MiB)  # one fragment fits (twice its size), the second does not
    budget: MemoryBudget = app.settings.budget
    with serve(app) as base_url:
        async with connect(ws_url(base_url), max_size=None) as socket:
            first = {"type": "response.create", "model": "reference", "input": "Say hi."}
            await socket.send(json.dumps(first))
            kept = await terminal(socket)
            assert kept["type"] == "response.completed", kept
            before = budget.held
            create = {"type": "response.create", "model": "reference", "input": "Again."}
            sending = Fragmented(socket, pieces(create, 4 * FRAGMENT))
            # Refused while the message still arrives, and what it held let go at once.
            await until(lambda: budget.refusals == 1)
            await until(lambda: budget.held == before)
            assert not sending.finishing.is_set()
            await sending.finish()
            refused = await terminal(socket)
            assert refused["error"]["code"] == "server_is_overloaded", refused
            assert refused["status"] == 503
            # The socket and its cached response are kept: the conversation goes on.
            follow = {
                "type": "response.create",
                "model": "reference",
                "previous_response_id": kept["response"]["id"],
                "input": "And once more.",
            }
            await socket.send(json.dumps(follow))
            answer = await terminal(socket)
    assert answer["type"] == "response.completed", answer
    assert budget.refusals == 1


@pytest.mark.anyio
async def test_the_fragments_of_a_client_that_leaves_mid_message_are_let_go() -> None:
    app = middleware()
    budget: MemoryBudget = app.settings.budget
    with serve(app) as base_url:
        socket = await connect(ws_url(base_url), max_size=None)
        await until(lambda: budget.held > 0)
        parts = pieces({"type": "response.create", "model": "reference"}, 3 * FRAGMENT)
        sending = Fragmented(socket, parts)
        await until(lambda: budget.held >= 3 * FRAGMENT)
        socket.transport.abort()  # gone, without a close
        await until(lambda: budget.held == 0)
        sending.sending.cancel()
        await asyncio.gather(sending.sending, return_exceptions=True)


def compressing(*, context_takeover: bool) -> ClientPerMessageDeflateFactory:
    """The client's permessage-deflate, every message compressed, with or without context
    takeover for what the client sends."""
    return ClientPerMessageDeflateFactory(
        client_no_context_takeover=not context_takeover, client_max_window_bits=True
    )


@pytest.mark.anyio
@pytest.mark.parametrize("context_takeover", [True, False])
async def test_a_compressed_frame_the_budget_cannot_hold_is_dropped_as_it_inflates(
    context_takeover: bool,
) -> None:
    app = middleware(limit=24 * MiB)  # half of what the 16 MiB message would reserve
    budget: MemoryBudget = app.settings.budget
    extensions = [compressing(context_takeover=context_takeover)]
    with serve(app) as base_url:
        async with connect(ws_url(base_url), max_size=None, extensions=extensions) as socket:
            first = {"type": "response.create", "model": "reference", "input": "Say hi."}
            await socket.send(json.dumps(first))
            kept = await terminal(socket)
            assert kept["type"] == "response.completed", kept
            before = budget.held
            # 16 MiB in one frame of a few KiB: refused before it is inflated whole.
            huge = {"type": "response.create", "model": "reference", "input": "x" * 16 * MiB}
            await socket.send(json.dumps(huge))
            refused = await terminal(socket)
            assert refused["error"]["code"] == "server_is_overloaded", refused
            assert budget.refusals == 1
            await until(lambda: budget.held == before)
            # What follows inflates as it should: the two sides' contexts are in step.
            follow = {
                "type": "response.create",
                "model": "reference",
                "previous_response_id": kept["response"]["id"],
                "input": "And once more, " + "y" * 3 * INFLATE_STEP,
            }
            await socket.send(json.dumps(follow))
            answer = await terminal(socket)
            assert answer["type"] == "response.completed", answer
    assert budget.refusals == 1
