"""One turn, from a `response.create` to its cached response (`ws_mode._turn_runner`), driven
through the middleware over an in-process socket (asgiref's `ApplicationCommunicator`) with a
real Starlette handler: a cached parent is joined into the handler's request (or passed on by
id, `full_context="on_miss"`); a parent missing from the cache is looked up in the store, else
answered `previous_response_not_found` without calling the handler (or forwarded); a
`generate: false` warm-up is answered without the handler and continued from; a failed
continuation drops its parent on its own lane; a handler past `max_turn_seconds` is cut."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from asgiref.testing import ApplicationCommunicator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ws_mode import Limits, MemoryStore, WebSocketModeMiddleware
from ws_mode._persistence import flush_writes

pytestmark = pytest.mark.anyio

#: A bound on what must not hang (never a speed).
HANG = 10.0
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def answer(number: int) -> dict[str, Any]:
    text = {"type": "output_text", "text": f"answer {number}", "annotations": []}
    return {
        "type": "message",
        "id": f"msg_{number}",
        "role": "assistant",
        "status": "completed",
        "content": [text],
    }


class Handler:
    """`POST /v1/responses`, recording each request body. The model says what it does: `ok`
    answers, `fail` answers an error, `hang` never answers."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def respond(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        number = len(self.bodies)
        if body["model"] == "fail":
            error = {"type": "server_error", "code": "model_overloaded", "message": "busy"}
            return JSONResponse({"error": error}, status_code=503)
        if body["model"] == "hang":
            await asyncio.Event().wait()
        response = {
            "id": f"resp_{number}",
            "object": "response",
            "status": "completed",
            "model": body["model"],
            "output": [answer(number)],
        }
        return JSONResponse(response)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/responses", self.respond, methods=["POST"])])


class Socket:
    """A WebSocket mode connection to `middleware`, in this event loop."""

    def __init__(self, middleware: WebSocketModeMiddleware) -> None:
        scope = {
            "type": "websocket",
            "path": "/v1/responses",
            "raw_path": b"/v1/responses",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"host", b"testserver")],
            "subprotocols": [],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "scheme": "ws",
            "asgi": {"version": "3.0"},
        }
        self.communicator = ApplicationCommunicator(middleware, scope)

    async def open(self) -> None:
        await self.communicator.send_input({"type": "websocket.connect"})
        accepted = await self.communicator.receive_output(HANG)
        assert accepted["type"] == "websocket.accept", accepted

    async def turn(self, **fields: Any) -> list[dict[str, Any]]:
        """Send one create; the events of its turn, up to its terminal one."""
        create = {"type": "response.create", "model": "ok", **fields}
        await self.communicator.send_input(
            {"type": "websocket.receive", "text": json.dumps(create)}
        )
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] not in TERMINAL:
            message = await self.communicator.receive_output(HANG)
            assert message["type"] == "websocket.send", message
            events.append(json.loads(message["text"]))
        return events

    async def close(self) -> None:
        await self.communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.communicator.wait(HANG)


@pytest.fixture
def handler() -> Handler:
    return Handler()


async def served(handler: Handler, **options: Any) -> tuple[WebSocketModeMiddleware, Socket]:
    middleware = WebSocketModeMiddleware(handler.app(), **options)
    socket = Socket(middleware)
    await socket.open()
    return middleware, socket


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    return events[-1]


# --- a cached parent ---------------------------------------------------------------------------


async def test_a_cached_parent_is_joined_into_the_handlers_request(handler: Handler) -> None:
    middleware, socket = await served(handler)
    first = terminal(await socket.turn(input="Hello"))["response"]
    asked = {"role": "user", "content": "And then?"}
    second = terminal(await socket.turn(input=[asked], previous_response_id=first["id"]))
    await socket.close()
    assert handler.bodies[0]["input"] == "Hello"  # a fresh chain is passed on as sent
    context = handler.bodies[1]["input"]
    assert context[1:] == [answer(1), asked]  # the parent's output, then the new input
    assert context[0]["content"] == "Hello"
    assert "previous_response_id" not in handler.bodies[1]  # the handler needs no state
    assert second["type"] == "response.completed"
    assert second["response"]["previous_response_id"] == first["id"]
    stats = middleware.stats
    assert (stats.cache_hits, stats.cache_misses, stats.turns) == (1, 0, 2)
    # What the client did not send again: the parent's context, encoded.
    assert stats.bytes_saved == len(orjson.dumps(context[0])) + len(orjson.dumps(answer(1)))


async def test_on_miss_mode_passes_a_cached_parent_on_by_id_with_the_new_input_only(
    handler: Handler,
) -> None:
    _middleware, socket = await served(handler, full_context="on_miss")
    first = terminal(await socket.turn(input="Hello"))["response"]
    asked = {"role": "user", "content": "And then?"}
    await socket.turn(input=[asked], previous_response_id=first["id"])
    await socket.close()
    assert handler.bodies[1]["input"] == [asked]
    assert handler.bodies[1]["previous_response_id"] == first["id"]


# --- a parent missing from the cache -------------------------------------------------------------


async def test_an_unknown_parent_is_not_found_and_the_handler_is_not_called(
    handler: Handler,
) -> None:
    middleware, socket = await served(handler)
    events = await socket.turn(input="x", previous_response_id="resp_unknown", stream_id="lane")
    after = terminal(await socket.turn(input="Start over"))  # the connection goes on
    await socket.close()
    (error,) = events
    assert error["type"] == "error"
    assert error["status"] == 400
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    assert "resp_unknown" in error["error"]["message"]
    assert error["stream_id"] == "lane"
    assert [body["input"] for body in handler.bodies] == ["Start over"]
    assert after["type"] == "response.completed"
    assert middleware.stats.cache_misses == 1
    assert middleware.stats.errors["previous_response_not_found"] == 1


async def test_forwarding_misses_passes_the_unknown_parent_on_to_the_handler(
    handler: Handler,
) -> None:
    _middleware, socket = await served(handler, on_cache_miss="forward")
    asked = {"role": "user", "content": "Go on"}
    event = terminal(await socket.turn(input=[asked], previous_response_id="resp_elsewhere"))
    await socket.close()
    assert event["type"] == "response.completed"
    (body,) = handler.bodies
    assert body["previous_response_id"] == "resp_elsewhere"  # the handler resolves it
    assert body["input"] == [asked]


async def test_a_parent_missing_from_the_cache_is_hydrated_from_the_store(
    handler: Handler,
) -> None:
    store = MemoryStore()
    first_worker = WebSocketModeMiddleware(handler.app(), store=store, shared_store=True)
    second_worker = WebSocketModeMiddleware(handler.app(), store=store, shared_store=True)
    socket = Socket(first_worker)
    await socket.open()
    first = terminal(await socket.turn(input="Hello"))["response"]
    await socket.close()
    await flush_writes(HANG)
    socket = Socket(second_worker)
    await socket.open()
    event = terminal(await socket.turn(input="More", previous_response_id=first["id"]))
    await socket.close()
    assert event["type"] == "response.completed"
    context = handler.bodies[1]["input"]
    assert [item["content"] for item in context[::2]] == ["Hello", "More"]
    assert context[1] == answer(1)
    stats = second_worker.stats
    assert (stats.cache_misses, stats.store_hydrations, stats.turns) == (1, 1, 1)


class DownStore(MemoryStore):
    async def get_ancestors(self, principal: str, response_id: str) -> list[Any]:
        raise ConnectionError("down")


async def test_a_store_that_cannot_be_asked_is_store_unavailable(handler: Handler) -> None:
    _middleware, socket = await served(handler, store=DownStore(), shared_store=True)
    events = await socket.turn(input="More", previous_response_id="resp_1")
    await socket.close()
    (error,) = events
    assert (error["status"], error["error"]["code"]) == (503, "store_unavailable")
    assert "down" not in error["error"]["message"]
    assert handler.bodies == []


# --- warm-ups ------------------------------------------------------------------------------------


async def test_a_warm_up_is_answered_without_the_handler_and_continued_from(
    handler: Handler,
) -> None:
    middleware, socket = await served(handler)
    system = {"role": "system", "content": "Be brief."}
    events = await socket.turn(input=[system], generate=False, stream_id="lane")
    assert handler.bodies == []
    assert [event["type"] for event in events] == ["response.created", "response.completed"]
    assert {event["stream_id"] for event in events} == {"lane"}
    warm = terminal(events)["response"]
    assert warm["id"].startswith("resp_")
    assert (warm["status"], warm["output"], warm["model"]) == ("completed", [], "ok")
    asked = {"role": "user", "content": "Hi"}
    event = terminal(await socket.turn(input=[asked], previous_response_id=warm["id"]))
    await socket.close()
    assert event["type"] == "response.completed"
    assert handler.bodies[0]["input"] == [system, asked]  # the warm-up's input came first
    stats = middleware.stats
    assert (stats.warm_ups, stats.turns, stats.cache_hits) == (1, 1, 1)


# --- a failed continuation -----------------------------------------------------------------------


@pytest.mark.parametrize(("lane", "parent_kept"), [("a", False), ("b", True)])
async def test_a_failed_continuation_drops_its_parent_on_the_parents_own_lane(
    handler: Handler, lane: str, parent_kept: bool
) -> None:
    _middleware, socket = await served(handler)
    first = terminal(await socket.turn(input="Hello", stream_id="a"))["response"]
    failed = terminal(
        await socket.turn(model="fail", input="x", previous_response_id=first["id"], stream_id=lane)
    )
    again = terminal(await socket.turn(input="y", previous_response_id=first["id"], stream_id=lane))
    await socket.close()
    assert failed["type"] == "error"
    assert failed["error"]["code"] == "model_overloaded"
    if parent_kept:
        assert again["type"] == "response.completed"
    else:
        assert again["error"]["code"] == "previous_response_not_found"


# --- a turn that does not end --------------------------------------------------------------------


async def test_a_handler_past_max_turn_seconds_is_cut_and_the_lane_goes_on(
    handler: Handler,
) -> None:
    middleware, socket = await served(handler, limits=Limits(max_turn_seconds=0.2))
    cut = terminal(await socket.turn(model="hang", input="x", stream_id="lane"))
    after = terminal(await socket.turn(input="y", stream_id="lane"))
    await socket.close()
    assert (cut["type"], cut["status"], cut["error"]["code"]) == ("error", 504, "turn_timeout")
    assert cut["stream_id"] == "lane"
    assert after["type"] == "response.completed"
    assert middleware.stats.turns_failed == 1
