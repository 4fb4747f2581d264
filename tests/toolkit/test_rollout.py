"""The rollout drivers against the reference server under a real uvicorn: HTTP with the full
history and WebSocket mode with only the new items give the same answer, the socket sends far
fewer bytes, and every kind of failure raises RolloutError."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.servers import free_port, serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.reference import ReferenceConfig, create_app
from ws_mode.toolkit.rollout import (
    RolloutError,
    RolloutResult,
    run_http,
    run_socket,
    tool_output,
)

TURNS = 8


@pytest.fixture(scope="module", params=["always", "on_miss"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Starlette, str]]:
    reference = create_app(ReferenceConfig(tool_calls=TURNS - 1, answer_tokens=8))
    app = WebSocketModeMiddleware(reference, full_context=request.param)
    with serve(app) as base_url:
        yield base_url, reference, request.param


def test_http_and_socket_give_the_same_rollout(server: tuple[str, Starlette, str]) -> None:
    base_url, reference, full_context = server
    stats = reference.state.reference_stats
    seen: list[int] = []
    stats.reset()
    over_http = run_http(base_url, turns=TURNS, tool_output_bytes=4096, on_turn=lambda t, s: None)
    http_parsed = stats.bytes_parsed
    stats.reset()
    over_socket = run_socket(
        base_url, turns=TURNS, tool_output_bytes=4096, on_turn=lambda t, s: seen.append(t)
    )
    socket_parsed = stats.bytes_parsed

    for result, mode in ((over_http, "http"), (over_socket, "socket")):
        assert result.mode == mode
        assert result.turns == TURNS
        assert result.tool_calls == TURNS - 1
        assert len(result.turn_bytes) == len(result.response_ids) == TURNS
        assert all(seconds > 0 for seconds in result.turn_seconds)
        assert result.total_seconds >= sum(result.turn_seconds)
        assert f"answered after {TURNS - 1} tool calls" in result.answer
    assert seen == list(range(1, TURNS + 1))
    # The answer holds a digest of the whole context: equal answers mean equal contexts.
    assert over_socket.answer == over_http.answer
    # HTTP re-sends the growing history; the socket sends one tool output per turn.
    assert over_http.turn_bytes == sorted(over_http.turn_bytes)
    assert max(over_socket.turn_bytes[1:]) < 4096 + 1024
    assert over_socket.bytes_sent * 3 < over_http.bytes_sent
    assert http_parsed == over_http.bytes_sent
    if full_context == "always":  # drop-in: the handler still parses the whole history
        assert socket_parsed == http_parsed
    else:  # cache-aware: only the new items
        assert socket_parsed * 3 < http_parsed


def test_the_rollout_stops_when_the_model_answers(server: tuple[str, Starlette, str]) -> None:
    base_url, _, _ = server
    result = run_socket(base_url, turns=TURNS + 5, tool_output_bytes=10)
    assert result.turns == TURNS
    assert result.tool_calls == TURNS - 1


def test_a_model_that_keeps_asking_for_tools_raises(server: tuple[str, Starlette, str]) -> None:
    base_url, _, _ = server
    for run in (run_http, run_socket):
        with pytest.raises(RolloutError, match="still asks for a tool after 2 turns"):
            run(base_url, turns=2, tool_output_bytes=10)


def test_an_error_answer_raises(server: tuple[str, Starlette, str]) -> None:
    base_url, _, _ = server
    bad = {"reference_tool_calls": "many"}  # the reference server answers 400 invalid_value
    with pytest.raises(RolloutError, match=r"HTTP 400.*invalid_value"):
        run_http(base_url, turns=2, metadata=bad)
    with pytest.raises(RolloutError, match=r"error: invalid_value 400"):
        run_socket(base_url, turns=2, metadata=bad)
    with pytest.raises(RolloutError, match="HTTP 404"):
        run_http(base_url, turns=2, path="/v2/nothing")
    with pytest.raises(RolloutError, match="refused the WebSocket"):
        run_socket(base_url, turns=2, path="/v2/nothing")


def test_an_unreachable_server_raises() -> None:
    base_url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RolloutError, match="could not"):
        run_http(base_url, turns=2, timeout=5)
    with pytest.raises(RolloutError, match="could not connect"):
        run_socket(base_url, turns=2, timeout=5)


async def _failing(request: Request) -> Response:
    """A handler whose responses fail after starting."""
    await request.body()
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    failed = {
        **response,
        "status": "failed",
        "error": {"code": "server_error", "message": "the model crashed"},
    }

    async def events() -> AsyncIterator[bytes]:
        for number, (kind, body) in enumerate(
            (("response.created", response), ("response.failed", failed))
        ):
            data = json.dumps({"type": kind, "sequence_number": number, "response": body})
            yield f"event: {kind}\ndata: {data}\n\n".encode()

    return StreamingResponse(events(), media_type="text/event-stream")


def test_a_failed_response_raises() -> None:
    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", _failing, methods=["POST"])])
    )
    with serve(app) as base_url:
        for run in (run_http, run_socket):
            with pytest.raises(RolloutError, match=r"response.failed: the model crashed"):
                run(base_url, turns=2)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="turns"):
        run_http("http://127.0.0.1:1", turns=0)
    with pytest.raises(ValueError, match="tool_output_bytes"):
        run_socket("http://127.0.0.1:1", turns=1, tool_output_bytes=-1)


def test_tool_outputs_are_deterministic_and_sized() -> None:
    for size in (0, 1, 7, 4096, 100_000):
        output = tool_output("call_abc", size)
        assert len(output.encode()) == size
        assert len(json.dumps(output)) == size + 2  # nothing to escape
        assert output == tool_output("call_abc", size)
    assert tool_output("call_abc", 64) != tool_output("call_abd", 64)


def test_medians() -> None:
    result = RolloutResult(mode="http", turn_seconds=[5.0, 1.0, 3.0, 9.0, 7.0, 8.0, 20.0])
    assert result.early_median() == 3.0
    assert result.late_median() == 8.0
    assert result.early_median(2) == 3.0
    assert RolloutResult(mode="socket").late_median() == 0.0
    assert RolloutResult(mode="socket", turn_bytes=[3, 4]).bytes_sent == 7
