"""One `sequence_number` numbering per response: the events ws_mode adds to a handler's stream
(a steer's acceptance, the steered `response.incomplete`, the interrupt's events) and the
handler's own events share it, strictly increasing, whatever comes between them. On a real
server: `test_one_numbering_for_the_handlers_events_a_steer_and_the_interrupt` in
`tests/library/test_interrupt.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.library.test_events import MESSAGE, Recorder, delta, response
from ws_mode._events import ResponseStream
from ws_mode._steering import Steer, SteerInbox


@pytest.mark.anyio
@pytest.mark.parametrize("stream_id", [None, "lane"])
async def test_the_handlers_events_after_one_ws_mode_added_are_numbered_after_it(
    stream_id: str | None,
) -> None:
    recorder = Recorder(stream_id=stream_id)
    await recorder.sse("response.output_text.delta", delta(sequence_number=7))
    assert recorder.stream.next_sequence_number() == 8  # a steer's acceptance, say
    await recorder.sse("response.output_text.delta", delta(sequence_number=8))
    await recorder.stream.event(delta(sequence_number=9), from_handler=True)
    assert [event["sequence_number"] for event in recorder.decoded] == [7, 9, 10]
    assert recorder.stream.next_sequence_number() == 11


def _handler_events(items: int, deltas: int) -> list[dict[str, Any]]:
    """A streamed response's events as a handler sends them, not numbered yet."""
    started = response(status="in_progress", previous_response_id="resp_0")
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    output = []
    for index in range(items):
        item = {**MESSAGE, "id": f"msg_{index}"}
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        for _ in range(deltas):
            events.append({**delta(text="x"), "item_id": item["id"], "output_index": index})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        output.append(item)
    done = response(output=output, previous_response_id="resp_0")
    events.append({"type": "response.completed", "response": done})
    return events


@settings(max_examples=200, deadline=None)
@given(
    items=st.integers(1, 3),
    deltas=st.integers(0, 3),
    first=st.integers(0, 3),
    gaps=st.lists(st.integers(1, 3), min_size=20, max_size=20),
    steps=st.lists(st.sampled_from(["event", "object", "steer", "cut", "interrupt"]), max_size=40),
    stream_id=st.sampled_from([None, "lane"]),
)
def test_every_event_of_a_response_has_a_higher_sequence_number_than_the_last(
    items: int,
    deltas: int,
    first: int,
    gaps: list[int],
    steps: list[str],
    stream_id: str | None,
) -> None:
    """Whatever comes between the handler's events (a steer's acceptance, a steering cut, an
    interrupt), the sequence numbers the client receives on a response strictly increase, and
    the handler's own numbers are kept until ws_mode adds an event."""

    async def run() -> list[int]:
        recorder = Recorder(stream_id=stream_id, previous="resp_0")
        stream = recorder.stream = ResponseStream(
            recorder, recorder, stream_id=stream_id, previous_response_id="resp_0",
            inbox=SteerInbox(),
        )  # fmt: skip
        assert stream.inbox is not None
        handler = _handler_events(items, deltas)
        number = first
        for index, event in enumerate(handler):  # the handler's own numbering, with gaps
            event["sequence_number"] = number
            number += gaps[index % len(gaps)]
        pending = iter(steps + ["event"] * len(handler))
        while handler and not stream.finished:
            step = next(pending)
            if step in ("event", "object"):
                event = handler.pop(0)
                if step == "event":
                    await recorder.sse(event["type"], event)
                else:
                    framed = stream.frame_object(event)
                    if isinstance(framed, str):
                        await stream.send_text(framed)
                    else:
                        await stream.event(framed, from_handler=True)
            elif step == "steer" and stream.response_id is not None:
                # `response.steer.accepted`, sent as the connection sends it: at once.
                accepted = {"type": "response.steer.accepted"}
                accepted["sequence_number"] = stream.next_sequence_number()
                recorder.frames.append(json.dumps(accepted))
            elif step == "cut" and stream.response_id is not None:
                stream.inbox.put(Steer("steer_1", "resp_1", "more", []))
            elif step == "interrupt" and stream.response_id is not None:
                stream.interrupt()
                assert stream.interruption is not None
                recorder.frames.extend(stream.interruption)
        return [event["sequence_number"] for event in recorder.decoded]

    numbers = asyncio.run(run())
    assert numbers, "nothing was sent"
    assert all(a < b for a, b in itertools.pairwise(numbers)), numbers
    if not {"steer", "cut", "interrupt"} & set(steps):
        assert numbers == [
            first + sum(gaps[index % len(gaps)] for index in range(position))
            for position in range(len(numbers))
        ]
