"""The lane scheduler, without a socket: order per lane, concurrency, budgets and refusals."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ws_mode import Limits
from ws_mode._client_events import CreateEvent, ProtocolError
from ws_mode._items import Items
from ws_mode._lanes import Lanes


def create(stream_id: str | None, tag: str = "") -> CreateEvent:
    return CreateEvent(
        fields={"metadata": {"tag": tag}},
        items=Items([]),
        input_text=None,
        input_sent=False,
        previous_response_id=None,
        stream_id=stream_id,
        generate=True,
        tools=None,
    )


class Recorder:
    """Runs each request until released; records what started, finished and was refused."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.refused: list[str] = []
        self.running = 0
        self.most_running = 0
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, tag: str) -> asyncio.Event:
        return self.gates.setdefault(tag, asyncio.Event())

    async def run(self, request: CreateEvent) -> None:
        tag = request.fields["metadata"]["tag"]
        self.started.append(tag)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.gate(tag).wait()
        finally:
            self.running -= 1
        self.finished.append(tag)

    async def refuse(self, error: ProtocolError) -> None:
        self.refused.append(error.code)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def lanes_for(recorder: Recorder, **limits: Any) -> Lanes:
    return Lanes(Limits(**limits), run=recorder.run, refuse=recorder.refuse)


@pytest.mark.anyio
async def test_one_lane_runs_first_in_first_out_and_never_overlaps() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder)
    for tag in ("a", "b", "c"):
        lanes.submit(create("main", tag))
    await settle()
    assert recorder.started == ["a"]
    recorder.gate("a").set()
    await settle()
    assert recorder.started == ["a", "b"]
    recorder.gate("c").set()  # released early: still waits for b
    await settle()
    assert recorder.finished == ["a"]
    recorder.gate("b").set()
    await settle()
    assert recorder.finished == ["a", "b", "c"]
    assert recorder.most_running == 1
    assert lanes.tasks() == []  # an idle lane is gone


@pytest.mark.anyio
async def test_lanes_run_concurrently_within_the_in_flight_budget() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder, max_in_flight=2)
    for index, stream_id in enumerate((None, "x", "y")):
        lanes.submit(create(stream_id, str(index)))
    await settle()
    assert recorder.started == ["0", "1"]
    assert lanes.queued() == 1  # the third waits for a slot, and counts as waiting
    recorder.gate("0").set()
    await settle()
    assert recorder.started == ["0", "1", "2"]
    assert recorder.most_running == 2
    await lanes.stop()


@pytest.mark.anyio
async def test_named_lanes_are_bounded_over_the_connection_life() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder, max_streams=2)
    for stream_id in ("a", "b"):
        recorder.gate(stream_id).set()
        lanes.submit(create(stream_id, stream_id))
    await settle()
    assert recorder.finished == ["a", "b"]
    lanes.submit(create("a", "a"))  # a known name stays usable after its lane went idle
    lanes.submit(create(None, "a"))  # the default lane does not count
    with pytest.raises(ProtocolError) as refused:
        lanes.submit(create("c"))
    assert refused.value.code == "websocket_stream_limit_reached"
    assert refused.value.stream_id == "c"
    await lanes.stop()


@pytest.mark.anyio
async def test_waiting_requests_are_bounded() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder, max_queued=2)
    lanes.submit(create(None, "running"))
    await settle()
    lanes.submit(create(None, "wait1"))
    lanes.submit(create(None, "wait2"))
    with pytest.raises(ProtocolError) as refused:
        lanes.submit(create("other"))
    assert (refused.value.code, refused.value.status) == ("too_many_queued_requests", 429)
    await lanes.stop()
    assert lanes.queued() == 0


@pytest.mark.anyio
async def test_a_refusal_waits_for_its_busy_lane() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder)
    lanes.submit(create("main", "a"))
    await settle()
    late = ProtocolError("bad", code="invalid_type", stream_id="main", on_lane=True)
    assert lanes.refuse_in_order(late)
    idle = ProtocolError("bad", code="invalid_type", stream_id="idle", on_lane=True)
    assert not lanes.refuse_in_order(idle)  # an idle lane: the caller answers at once
    unscoped = ProtocolError("bad", code="invalid_json", stream_id="main")
    assert not lanes.refuse_in_order(unscoped)
    await settle()
    assert recorder.refused == []
    recorder.gate("a").set()
    await settle()
    assert recorder.refused == ["invalid_type"]


class Gone(Exception):
    pass


@pytest.mark.anyio
async def test_an_ending_exception_ends_the_lane_quietly() -> None:
    ran: list[str] = []

    async def run(request: CreateEvent) -> None:
        ran.append(request.fields["metadata"]["tag"])
        raise Gone

    async def refuse(error: ProtocolError) -> None:
        raise AssertionError("no refusal expected")

    lanes = Lanes(Limits(), run=run, refuse=refuse, ends_lane=(Gone,))
    lanes.submit(create(None, "a"))
    lanes.submit(create(None, "b"))
    await settle()
    assert ran == ["a"]  # the client is gone: nothing more runs on that lane
    assert lanes.tasks() == []


@pytest.mark.anyio
async def test_stop_cancels_running_and_drops_waiting_requests() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder)
    lanes.submit(create(None, "a"))
    lanes.submit(create(None, "b"))
    await settle()
    await lanes.stop()
    assert recorder.started == ["a"]
    assert recorder.finished == []
    assert lanes.tasks() == []
    assert lanes.queued() == 0


Plan = list[tuple[str | None, int]]


async def _never(error: ProtocolError) -> None:
    raise AssertionError(f"unexpected refusal {error.code}")


@settings(max_examples=60)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c"]), st.integers(0, 3)), max_size=25
    ),
    budget=st.integers(1, 4),
)
def test_any_schedule_keeps_lane_order_and_the_budget(plan: Plan, budget: int) -> None:
    """Whatever arrives, every request runs once, each lane in arrival order, and no more
    than `max_in_flight` at a time."""

    async def scenario() -> tuple[list[tuple[str | None, int]], int]:
        order: list[tuple[str | None, int]] = []
        running = most = 0

        async def run(request: CreateEvent) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            order.append((request.stream_id, request.fields["metadata"]["tag"]))
            for _ in range(request.fields["metadata"]["yields"]):
                await asyncio.sleep(0)
            running -= 1

        lanes = Lanes(Limits(max_in_flight=budget), run=run, refuse=_never)
        for index, (stream_id, yields) in enumerate(plan):
            request = create(stream_id)
            request.fields["metadata"] = {"tag": index, "yields": yields}
            lanes.submit(request)
            await asyncio.sleep(0)
        while lanes.tasks():  # a lane's task ends only once its queue is empty
            await asyncio.gather(*lanes.tasks())
        return order, most

    order, most = asyncio.run(scenario())
    assert sorted(tag for _, tag in order) == list(range(len(plan)))
    for lane in {stream_id for stream_id, _ in plan}:
        tags = [tag for stream_id, tag in order if stream_id == lane]
        assert tags == sorted(tags)
    assert most <= budget


@pytest.mark.anyio
async def test_a_failing_request_does_not_stop_the_ones_behind_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []

    async def run(request: CreateEvent) -> None:
        tag = request.fields["metadata"]["tag"]
        ran.append(tag)
        if tag == "bad":
            raise RuntimeError("boom")

    lanes = Lanes(Limits(), run=run, refuse=_never)
    for tag in ("bad", "good"):
        lanes.submit(create(None, tag))
    await settle()
    assert ran == ["bad", "good"]
    assert lanes.tasks() == []
    assert "a WebSocket mode request failed" in caplog.text


@pytest.mark.anyio
async def test_waiting_requests_are_bounded_by_bytes_too() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder, max_queued_bytes=1000)
    big = create(None, "running")
    big.size = 5000  # one request may always wait, whatever its size
    lanes.submit(big)
    await settle()
    assert lanes.queued_bytes == 0  # running requests are not waiting
    first = create(None, "wait1")
    first.size = 5000
    lanes.submit(first)
    assert lanes.queued_bytes == 5000
    second = create("other", "wait2")
    second.size = 10
    with pytest.raises(ProtocolError) as refused:
        lanes.submit(second)
    assert refused.value.code == "too_many_queued_requests"
    assert "max_queued_bytes" in refused.value.message
    recorder.gate("running").set()
    await settle()
    assert lanes.queued_bytes == 0
    await lanes.stop()


@pytest.mark.anyio
async def test_a_waiting_refusal_keeps_no_trace_of_its_frame() -> None:
    """A refusal queued on a busy lane holds its message only, not the frame it refused."""
    recorder = Recorder()
    lanes = lanes_for(recorder)
    lanes.submit(create("main", "a"))
    await settle()
    try:
        try:
            raise ValueError("x" * 1000)  # stands for the parse error holding the frame
        except ValueError:
            raise ProtocolError("bad", code="invalid_type", stream_id="main", on_lane=True)  # noqa: B904
    except ProtocolError as error:
        refusal = error
    assert refusal.__context__ is not None
    assert lanes.refuse_in_order(refusal)
    assert refusal.__context__ is None
    assert refusal.__traceback__ is None
    recorder.gate("a").set()
    await settle()
    assert recorder.refused == ["invalid_type"]


@pytest.mark.anyio
async def test_refusals_past_the_bound_are_answered_at_once() -> None:
    recorder = Recorder()
    lanes = lanes_for(recorder, max_queued=1)
    lanes.submit(create("main", "a"))
    await settle()
    lanes.submit(create("main", "b"))  # waits: the bound is reached
    refusal = ProtocolError("bad", code="invalid_type", stream_id="main", on_lane=True)
    assert not lanes.refuse_in_order(refusal)
    await lanes.stop()
