"""`stream_id` lanes: concurrency, FIFO order, the in-flight budget, the lane limit, forks."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from openai.types.responses.responses_server_event import ResponseWsError

from tests.integration.apps import TOOL, Call
from tests.integration.clients import (
    RawClient,
    Server,
    async_until_terminal,
    call_output,
    completed_response,
    create,
    sdk_recv,
    sdk_until_terminal,
)

# A scripted text turn streaming 8 deltas 20 ms apart: long enough for lanes to overlap.
SLOWISH = {"k": "0", "deltas": "8", "delay": "0.02"}


def by_lane(events: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    lanes: dict[str | None, list[dict[str, Any]]] = {}
    for event in events:
        lanes.setdefault(event.get("stream_id"), []).append(event)
    return lanes


def check_raw_frames(ws: RawClient, stream_id: str | None) -> None:
    """The raw frames of a lane name it exactly once; the default lane's never name one."""
    for frame in ws.frames:
        if stream_id is None:
            assert '"stream_id"' not in frame, frame
        else:
            assert frame.count('"stream_id"') == 1, frame
            assert json.loads(frame)["stream_id"] == stream_id


def overlap(first: Call, second: Call) -> bool:
    assert first.ended is not None
    assert second.ended is not None
    return first.started < second.ended and second.started < first.ended


def max_concurrency(calls: list[Call]) -> int:
    points = []
    for call in calls:
        assert call.ended is not None
        points += [(call.started, 1), (call.ended, -1)]
    running = peak = 0
    for _, step in sorted(points, key=lambda point: (point[0], point[1])):
        running += step
        peak = max(peak, running)
    return peak


def test_lanes_run_concurrently_and_every_event_names_its_lane(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="A", stream_id="a", meta=SLOWISH))
        ws.send(create(tag, input="B", stream_id="b", meta=SLOWISH))
        events = ws.until_terminal(2)
        frames = list(ws.frames)
        lanes = by_lane(events)
        assert set(lanes) == {"a", "b"}  # every event carries its lane
        for stream_id in ("a", "b"):
            lane = lanes[stream_id]
            assert lane[0]["type"] == "response.created"
            assert lane[-1]["type"] == "response.completed"
            assert [e["sequence_number"] for e in lane] == list(range(len(lane)))
        # Interleaved: both lanes streamed before either finished.
        first_end = next(i for i, e in enumerate(events) if e["type"] == "response.completed")
        assert {e["stream_id"] for e in events[:first_end]} == {"a", "b"}
        for frame in frames:
            assert frame.count('"stream_id"') == 1, frame

        # The default lane's events carry no stream_id at all.
        ws.frames.clear()
        ws.send(create(tag, input="C", meta={"k": "0"}))
        completed_response(ws.until_terminal())
        check_raw_frames(ws, None)
    calls = server.recorder.settled(tag, 3)
    assert overlap(calls[0], calls[1])
    assert all(call.turn["stream_id"] == lane for call, lane in zip(calls, "ab", strict=False))


@pytest.mark.parametrize("stream_id", [None, "fifo"])
def test_one_lane_is_first_in_first_out(server: Server, tag: str, stream_id: str | None) -> None:
    lane = {"stream_id": stream_id} if stream_id else {}
    with server.raw() as ws:
        for text in ("first", "second", "third"):
            ws.send(create(tag, input=text, meta=SLOWISH, **lane))
        events = ws.until_terminal(3)
        check_raw_frames(ws, stream_id)
    # Each response's events are contiguous and in the order of the creates.
    ids = [e["response"]["id"] for e in events if e["type"] == "response.created"]
    assert len(ids) == 3
    completed = [i for i, e in enumerate(events) if e["type"] == "response.completed"]
    created = [i for i, e in enumerate(events) if e["type"] == "response.created"]
    assert created[1] > completed[0]
    assert created[2] > completed[1]
    calls = server.recorder.settled(tag, 3)
    assert [call.body["input"] for call in calls] == ["first", "second", "third"]
    assert not overlap(calls[0], calls[1])
    assert not overlap(calls[1], calls[2])


def test_continuation_queued_behind_its_parent_on_the_same_lane(server: Server, tag: str) -> None:
    """A client may continue as soon as it knows the id: FIFO holds it until the parent is done."""
    with server.raw() as ws:
        ws.send(create(tag, input=[{"role": "user", "content": "Hi"}], stream_id="q", meta=SLOWISH))
        first = ws.recv()
        assert first["type"] == "response.created"
        parent_id = first["response"]["id"]
        ws.send(
            create(
                tag,
                input="Again.",
                previous_response_id=parent_id,
                stream_id="q",
                meta={"k": "0"},
            )
        )
        events = ws.until_terminal(2)
        results = [e for e in events if e["type"] in ("response.completed", "error")]
        assert [e["type"] for e in results] == ["response.completed", "response.completed"]
        assert results[1]["response"]["previous_response_id"] == parent_id
        assert results[1]["response"]["output"][0]["content"][0]["text"] == (
            "Done: received 3 items."
        )


@pytest.mark.parametrize("lanes", [["x", "y", "z"], [None, "y", "z"]])
def test_max_in_flight_queues_instead_of_rejecting(
    server: Server, tag: str, lanes: list[str | None]
) -> None:
    with server.raw("/serial") as ws:
        for stream_id in lanes:
            lane = {"stream_id": stream_id} if stream_id else {}
            ws.send(create(tag, input="Go.", meta=SLOWISH, **lane))
        events = ws.until_terminal(3, timeout=10)
    assert [e["type"] for e in events if e["type"] in ("error", "response.completed")] == [
        "response.completed"
    ] * 3
    calls = server.recorder.settled(tag, 3)
    assert len(calls) == 3
    assert max_concurrency(calls) == 1
    # The queued turns ran in the order they were sent.
    assert [call.turn["stream_id"] for call in calls] == lanes


def test_default_in_flight_budget_is_sixteen(server: Server, tag: str) -> None:
    with server.raw() as ws:
        for number in range(20):
            ws.send(
                create(
                    tag,
                    input="Go.",
                    stream_id=f"lane-{number}",
                    meta={"k": "0", "deltas": "4", "delay": "0.05"},
                )
            )
        events = ws.until_terminal(20, timeout=20)
    assert sum(e["type"] == "response.completed" for e in events) == 20
    calls = server.recorder.settled(tag, 20)
    assert len(calls) == 20
    assert 2 <= max_concurrency(calls) <= 16


def test_stream_limit_rejects_a_new_lane_only(server: Server, tag: str) -> None:
    with server.connect("/small") as conn:
        for stream_id in ("s1", "s2"):
            conn.response.create(
                model="scripted", input="Hi", stream_id=stream_id, metadata={"tag": tag}
            )
            assert sdk_until_terminal(conn)[-1].type == "response.completed"
        conn.response.create(model="scripted", input="Hi", stream_id="s3", metadata={"tag": tag})
        error = sdk_recv(conn)
        assert isinstance(error, ResponseWsError)
        assert error.status == 400
        assert error.stream_id == "s3"
        assert error.error.type == "invalid_request_error"
        assert error.error.code == "websocket_stream_limit_reached"
        assert error.error.param == "stream_id"
        # Known lanes and the default lane (which does not count) still work.
        for lane in ({"stream_id": "s1"}, {}):
            conn.response.create(model="scripted", input="Hi", metadata={"tag": tag}, **lane)
            events = sdk_until_terminal(conn)
            assert events[-1].type == "response.completed"
            assert {e.stream_id for e in events} == {lane.get("stream_id")}
    assert len(server.recorder.for_tag(tag)) == 4


def test_the_33rd_stream_id_is_refused_by_default(server: Server, tag: str) -> None:
    with server.raw() as ws:
        for number in range(32):
            ws.send(create(tag, input="Warm.", generate=False, stream_id=f"l{number}"))
        events = ws.until_terminal(32)
        assert [e["type"] for e in events].count("response.completed") == 32
        ws.send(create(tag, input="Warm.", generate=False, stream_id="l32"))
        error = ws.recv()
        assert error["type"] == "error"
        assert error["stream_id"] == "l32"
        assert error["error"]["code"] == "websocket_stream_limit_reached"
        ws.send(create(tag, input="Warm.", generate=False, stream_id="l0"))
        assert ws.until_terminal()[-1]["type"] == "response.completed"


@pytest.mark.parametrize("stream_id", ["", "has space", "x" * 257, "ünï", "a/b", 7, True, ["a"]])
def test_invalid_stream_id(server: Server, tag: str, stream_id: Any) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="Hi", stream_id=stream_id))
        error = ws.recv()
        assert error["type"] == "error"
        assert error["status"] == 400
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["code"] == "invalid_stream_id"
        assert error["error"]["param"] == "stream_id"
        assert "stream_id" not in error
        # The longest valid id works.
        ws.send(create(tag, input="Hi", meta={"k": "0"}, stream_id="L" * 256))
        assert completed_response(ws.until_terminal())
    assert len(server.recorder.for_tag(tag)) == 1


def test_invalid_stream_id_through_the_sdk(server: Server, tag: str) -> None:
    with server.connect() as conn:
        conn.response.create(model="scripted", input="Hi", stream_id="no spaces please")
        error = sdk_recv(conn)
        assert isinstance(error, ResponseWsError)
        assert (error.status, error.error.code, error.error.param) == (
            400,
            "invalid_stream_id",
            "stream_id",
        )


def test_cross_lane_fork(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="Start.", tools=[TOOL], stream_id="main"))
        parent = completed_response(ws.until_terminal())
        fork_input = [call_output(parent["output"][0], "forked")]
        for stream_id in ("side", None, "main"):
            lane = {"stream_id": stream_id} if stream_id else {}
            ws.frames.clear()
            ws.send(
                create(
                    tag,
                    input=fork_input,
                    previous_response_id=parent["id"],
                    meta={"k": "1"},
                    **lane,
                )
            )
            events = ws.until_terminal()
            check_raw_frames(ws, stream_id)
            response = completed_response(events)
            assert response["previous_response_id"] == parent["id"]
            assert response["output"][0]["content"][0]["text"] == "Done: received 3 items."
    calls = server.recorder.for_tag(tag)
    context = [{"role": "user", "content": "Start."}, *parent["output"], *fork_input]
    assert [call.body["input"] for call in calls[1:]] == [context] * 3
    assert [call.turn["stream_id"] for call in calls[1:]] == ["side", None, "main"]


def test_refusal_of_a_queued_create_keeps_the_lane_order(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="A", stream_id="a", meta=SLOWISH))
        assert ws.recv()["type"] == "response.created"
        ws.send(create(tag, input="B", stream_id="a", background=True))
        events = ws.until_terminal(2)
    ends = [e["type"] for e in events if e["type"] in ("response.completed", "error")]
    # The client reads lane "a" in order: the running response ends, then the refusal.
    assert ends == ["response.completed", "error"]


def test_post_response_work_does_not_delay_the_next_turn(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, "background", input="Hi", meta={"k": "0", "work": str(WORK)}))
        first = completed_response(ws.until_terminal())
        started = time.monotonic()
        ws.send(create(tag, input="More.", previous_response_id=first["id"], meta={"k": "0"}))
        completed_response(ws.until_terminal())
        elapsed = time.monotonic() - started
    # A turn that waited for the work took at least WORK seconds: an ordering, not a speed (a
    # tight bound failed on loaded machines).
    assert elapsed < WORK, f"the next turn waited {elapsed:.2f} s for the handler's background task"


#: Seconds of post-response work in `test_post_response_work_does_not_delay_the_next_turn`.
WORK = 5.0


@pytest.mark.anyio
async def test_lanes_with_the_async_sdk(server: Server, tag: str) -> None:
    async with server.async_openai() as client, client.responses.connect() as conn:
        for stream_id in ("left", "right"):
            await conn.response.create(
                model="scripted",
                input=stream_id,
                stream_id=stream_id,
                metadata={"tag": tag, **SLOWISH},
            )
        events = await async_until_terminal(conn, terminals=2)
        lanes = {event.stream_id for event in events}
        assert lanes == {"left", "right"}
        done = {e.stream_id: e.response for e in events if e.type == "response.completed"}
        # Continue both lanes from each other's responses (cross-lane forks), concurrently.
        for stream_id, other in (("left", "right"), ("right", "left")):
            await conn.response.create(
                model="scripted",
                input="Swap.",
                previous_response_id=done[other].id,
                stream_id=stream_id,
                metadata={"tag": tag, "k": "0"},
            )
        events = await async_until_terminal(conn, terminals=2)
        swapped = {e.stream_id: e.response for e in events if e.type == "response.completed"}
        assert swapped["left"].previous_response_id == done["right"].id
        assert swapped["right"].previous_response_id == done["left"].id
        assert swapped["left"].output_text == "Done: received 3 items."
    calls = server.recorder.settled(tag, 4)
    assert overlap(calls[0], calls[1])
