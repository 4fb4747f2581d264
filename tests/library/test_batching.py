"""`ws_mode.server.BatchingWebSocketProtocol`: uvicorn's websockets-sansio with batched writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._batching import FLUSH_BYTES, BatchingTransport
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app


class RecordingTransport:
    """What a transport was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", None))

    def write_eof(self) -> None:
        self.calls.append(("write_eof", None))

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def _batching() -> tuple[BatchingTransport, RecordingTransport]:
    real = RecordingTransport()
    return BatchingTransport(real, asyncio.get_running_loop()), real  # type: ignore[arg-type]


async def _next_pass() -> None:
    await asyncio.sleep(0)


def test_writes_of_one_pass_go_out_as_one_in_order() -> None:
    async def scenario() -> list[tuple[str, Any]]:
        batching, real = await _batching()
        batching.write(b"one ")
        batching.write(bytearray(b"two "))
        batching.writelines([b"three ", memoryview(b"four")])
        batching.write(b"")
        assert real.calls == []  # nothing written until the pass ends
        assert batching.get_write_buffer_size() == len(b"one two three four") + 7
        await _next_pass()
        batching.write(b"five")
        await _next_pass()
        return real.calls

    calls = asyncio.run(scenario())
    assert calls == [("write", b"one two three four"), ("write", b"five")]


def test_close_writes_what_is_kept_first_and_abort_drops_it() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        closed, closed_real = await _batching()
        closed.write(b"close frame")
        closed.close()
        aborted, aborted_real = await _batching()
        aborted.write(b"never sent")
        aborted.abort()
        await _next_pass()  # the scheduled flushes find nothing left
        return closed_real.calls, aborted_real.calls

    closed, aborted = asyncio.run(scenario())
    assert closed == [("write", b"close frame"), ("close", None)]
    assert aborted == [("abort", None)]


def test_a_long_burst_is_written_without_waiting_for_the_end_of_the_pass() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        batching, real = await _batching()
        half = b"x" * (FLUSH_BYTES // 2)
        batching.write(half)
        batching.write(half)  # FLUSH_BYTES kept: written now, where flow control sees them
        within_the_pass = list(real.calls)
        batching.write(b"tail")
        batching.write_eof()  # what is kept goes before the end of the writing side
        await _next_pass()
        return within_the_pass, real.calls

    within_the_pass, calls = asyncio.run(scenario())
    burst = ("write", b"x" * (FLUSH_BYTES // 2 * 2))
    assert within_the_pass == [burst]
    assert calls == [burst, ("write", b"tail"), ("write_eof", None)]


def test_nothing_is_written_to_a_closing_transport_and_the_rest_is_the_transports() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], str]:
        batching, real = await _batching()
        batching.write(b"late")
        real.closing = True
        await _next_pass()
        info: str = batching.get_extra_info("peername")
        return real.calls, info

    calls, info = asyncio.run(scenario())
    assert calls == []
    assert info == "info:peername"


@pytest.mark.parametrize("deflate", [True, False], ids=["deflate", "plain"])
def test_a_rollout_over_the_batched_protocol(deflate: bool) -> None:
    app = WebSocketModeMiddleware(create_app(ReferenceConfig(tool_calls=2, answer_tokens=5)))
    options: dict[str, Any] = {"ws": "ws_mode.server:BatchingWebSocketProtocol"}
    with (
        serve(app, lifetime=60, ws_per_message_deflate=deflate, **options) as base_url,
        connect(base_url, "/v1/responses", open_timeout=30) as socket,
    ):
        previous: str | None = None
        kinds: list[list[str]] = []
        for _ in range(3):
            event: dict[str, Any] = {
                "type": "response.create",
                "model": "reference",
                "input": [{"role": "user", "content": "x" * 5000}],
            }
            if previous is not None:
                event["previous_response_id"] = previous
            socket.send(event)
            events = socket.receive_turn(timeout=30)
            kinds.append([e["type"] for e in events])
            numbers = [e["sequence_number"] for e in events]
            assert numbers == sorted(numbers)
            previous = events[-1]["response"]["id"]
    for turn in kinds:
        assert turn[0] == "response.created"
        assert turn[-1] == "response.completed"
    assert all("response.function_call_arguments.done" in turn for turn in kinds)
