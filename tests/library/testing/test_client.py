"""The tools' clients (`ws_mode.testing._client`, `ws_mode.toolkit.http_client`) against the
reference server under a real uvicorn: a turn read to its terminal event, on any lane or on
one; lanes of one asyncio socket demultiplexed; frames that are no event, a closed socket and
HTTP failures each reported as what they are; a message past the client's limit refused
(against a hostile endpoint, `tests.hostile_endpoint`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Final

import orjson
import pytest
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from tests.hostile_endpoint import hostile_endpoint
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing._client import (
    ANY_LANE,
    DEFAULT_MAX_MESSAGE_BYTES,
    FrameError,
    MessageTooLarge,
    SocketClosed,
    connect,
    connect_async,
    decode_event,
    ends_turn,
    message_limit,
    socket_url,
)
from ws_mode.testing._loopback import ServerThread
from ws_mode.toolkit.http_client import HttpClient, HttpStatusError, NotAnEventStream
from ws_mode.toolkit.reference import ReferenceConfig, create_app


async def _binary(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_bytes(b"\x00event")
    await websocket.send_text("data: {}")
    await websocket.send_text("[1, 2]")
    await websocket.close()


def _app() -> WebSocketModeMiddleware:
    reference = create_app(ReferenceConfig(tool_calls=3))
    reference.router.routes.append(WebSocketRoute("/odd", _binary))
    return WebSocketModeMiddleware(reference)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with ServerThread(_app()) as url:
        yield url


def create(text: str, stream_id: str | None = None) -> dict[str, object]:
    event: dict[str, object] = {"type": "response.create", "model": "m", "input": text}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def test_socket_urls_follow_the_scheme() -> None:
    assert socket_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/v1/responses"
    assert socket_url("https://example.com", "/x") == "wss://example.com/x"
    assert socket_url("ws://h:1", "/v1/responses") == "ws://h:1/v1/responses"


def test_events_decode_or_say_what_they_are() -> None:
    assert decode_event('{"type": "error"}') == {"type": "error"}
    assert decode_event(b'{"type": "error"}') == {"type": "error"}
    with pytest.raises(FrameError) as not_json:
        decode_event("event: x")
    assert not_json.value.kind == "not_json"
    with pytest.raises(FrameError) as not_object:
        decode_event("[]")
    assert not_object.value.kind == "not_object"


def test_a_turn_ends_at_a_terminal_event_of_its_lane() -> None:
    done = {"type": "response.completed", "stream_id": "a"}
    assert ends_turn(done)
    assert ends_turn(done, "a")
    assert not ends_turn(done, "b")
    assert not ends_turn(done, None)
    assert ends_turn({"type": "error"}, None)
    assert not ends_turn({"type": "response.output_text.delta"}, ANY_LANE)


def test_a_sync_socket_reads_a_turn_and_a_lane(base_url: str) -> None:
    with connect(base_url) as socket:
        size = socket.send(create("hi"))
        assert size == len(orjson.dumps(create("hi")))
        events = socket.receive_turn(timeout=10)
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        # Two lanes at once: the turn of lane "b" ends at b's terminal event, whatever came
        # of lane "a" meanwhile.
        socket.send(create("first", "a"))
        socket.send(create("second", "b"))
        events = socket.receive_turn("b", timeout=10)
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["stream_id"] == "b"
        if not any(ends_turn(event, "a") for event in events):
            assert socket.receive_turn("a", timeout=10)[-1]["stream_id"] == "a"


def test_a_sync_socket_reports_frames_that_are_no_event_and_the_close(base_url: str) -> None:
    with connect(base_url, "/odd") as socket:
        kinds = []
        for _ in range(3):
            with pytest.raises(FrameError) as error:
                socket.receive(timeout=10)
            kinds.append(error.value.kind)
        assert kinds == ["binary_frame", "not_json", "not_object"]
        with pytest.raises(SocketClosed):
            socket.receive(timeout=10)


def test_a_sync_socket_times_a_turn_out(base_url: str) -> None:
    with connect(base_url) as socket, pytest.raises(TimeoutError):
        socket.receive_turn(timeout=0.2)  # nothing was asked


def test_an_async_socket_demultiplexes_its_lanes(base_url: str) -> None:
    errors: list[tuple[str, str]] = []

    async def main() -> list[list[dict[str, object]]]:
        stray = asyncio.Event()

        def on_error(kind: str, detail: str) -> None:
            errors.append((kind, detail))
            stray.set()

        async with await connect_async(base_url) as socket:
            socket.demultiplex([None, "a", "b"], on_error)
            for lane in (None, "a", "b"):
                await socket.send(create(f"on {lane}", lane))
            await socket.send(create("nobody reads this lane", "c"))
            lanes = ("b", None, "a")
            async with asyncio.timeout(10):
                turns = await asyncio.gather(*(socket.receive_turn(lane) for lane in lanes))
                await stray.wait()  # lane c's events reach no lane
            return turns

    turns = asyncio.run(main())
    for lane, events in zip(("b", None, "a"), turns, strict=True):
        assert events[-1]["type"] == "response.completed"
        assert all(event.get("stream_id") == lane for event in events)
    assert errors[0][0] == "unknown_stream_id"


def test_an_async_socket_lane_hears_the_close(base_url: str) -> None:
    errors: list[str] = []

    async def main() -> None:
        socket = await connect_async(base_url, "/odd")
        socket.demultiplex([None], lambda kind, detail: errors.append(kind))
        try:
            async with asyncio.timeout(10):
                await socket.receive_turn()
        finally:
            await socket.close()

    with pytest.raises(SocketClosed):
        asyncio.run(main())
    assert errors == ["binary_frame", "not_json", "not_object"]


MiB: Final = 1024 * 1024


@pytest.fixture(scope="module")
def hostile_url() -> Iterator[str]:
    """An endpoint answering each message with one 8 MiB frame."""
    with hostile_endpoint(8 * MiB) as url:
        yield url


@pytest.mark.parametrize("compression", [False, True], ids=["plain", "deflate"])
def test_a_message_past_the_limit_is_refused_with_a_clear_error(
    hostile_url: str, compression: bool
) -> None:
    """Refused at the frame's header, or (compressed) once its decompressed size passes the
    limit: the client closes with 1009 and names the limit, and the frame's size when the
    header gave it."""
    with connect(hostile_url, max_message_bytes=1 * MiB, compression=compression) as socket:
        socket.send(create("hi"))
        with pytest.raises(MessageTooLarge) as refused:
            socket.receive(timeout=10)
        assert socket.connection.close_code is not None  # closed, not left half-read
        # A send that comes after (another lane's, in a check) names the same cause.
        with pytest.raises(MessageTooLarge):
            socket.send(create("again"))
    assert refused.value.limit == 1 * MiB
    assert refused.value.size == (None if compression else 8 * MiB)
    assert "over the client's limit of 1048576 bytes (max_message_bytes)" in str(refused.value)
    assert "closed the socket with 1009" in str(refused.value)
    assert isinstance(refused.value, SocketClosed)  # what callers already catch


def test_an_async_socket_refuses_a_message_past_the_limit(hostile_url: str) -> None:
    errors: list[str] = []

    async def main() -> None:
        async with await connect_async(hostile_url, max_message_bytes=1 * MiB) as socket:
            await socket.send(create("hi"))
            async with asyncio.timeout(10):
                with pytest.raises(MessageTooLarge):
                    await socket.receive()
            with pytest.raises(MessageTooLarge):
                await socket.send(create("again"))
        # Demultiplexed, the lanes hear the close and the error says why.
        async with await connect_async(hostile_url, max_message_bytes=1 * MiB) as socket:
            socket.demultiplex([None], lambda kind, detail: errors.append(kind))
            await socket.send(create("hi"))
            async with asyncio.timeout(10):
                with pytest.raises(SocketClosed):
                    await socket.receive_turn()

    asyncio.run(main())
    assert errors == ["message_too_large"]


def test_the_default_limit_is_64_mib(base_url: str) -> None:
    """Without ``max_message_bytes`` both clients read at most 64 MiB (not any size); a
    frame that large is not sent here, websockets' own refusal is what the tests above see."""
    assert 64 * MiB == DEFAULT_MAX_MESSAGE_BYTES
    with connect(base_url) as socket:
        assert message_limit(socket.connection.protocol) == DEFAULT_MAX_MESSAGE_BYTES

    async def opened() -> int | None:
        async with await connect_async(base_url) as socket:
            return message_limit(socket.connection.protocol)

    assert asyncio.run(opened()) == DEFAULT_MAX_MESSAGE_BYTES


def test_the_http_client_streams_a_turn_and_reports_failures(base_url: str) -> None:
    with HttpClient(base_url, timeout=10) as http:
        body = orjson.dumps({"model": "m", "input": "hi", "stream": True})
        events = list(http.stream_events("/v1/responses", body))
        assert events[0]["type"] == "response.created"
        assert ends_turn(events[-1])
        answer = http.post_json("/v1/responses", {"model": "m", "input": "hi"})
        assert answer["object"] == "response"
        with pytest.raises(NotAnEventStream, match="application/json"):
            list(http.stream_events("/v1/responses", orjson.dumps({"input": "hi"})))
        with pytest.raises(HttpStatusError) as missing:
            http.get_json("/nowhere")
        assert missing.value.status == 404
        assert str(missing.value).startswith("HTTP 404: ")
        bad = {"model": "m", "input": "hi", "metadata": {"reference_tool_calls": "many"}}
        with pytest.raises(HttpStatusError) as invalid:
            list(http.stream_events("/v1/responses", orjson.dumps({**bad, "stream": True})))
        assert invalid.value.status == 400
        assert invalid.value.envelope["error"]["code"] == "invalid_value"
