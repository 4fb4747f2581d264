"""Large frames are parsed off the event loop, and come out as if parsed in place."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from ws_mode.client_events import CreateEvent, ProtocolError, parse_client_event
from ws_mode.frames import OFF_LOOP_BYTES, parse_frame


def big_create(items: int, **fields: object) -> str:
    input_items = [{"role": "user", "content": f"item {index}"} for index in range(items)]
    frame = {"type": "response.create", "model": "m", "input": input_items, **fields}
    return orjson.dumps(frame).decode()


def test_a_large_frame_parses_to_the_same_create_with_its_items_still_encoded() -> None:
    text = big_create(60_000, stream_id="lane", tools=[{"type": "function", "name": "f"}])
    assert len(text) >= OFF_LOOP_BYTES
    event = asyncio.run(parse_frame(text))
    in_place = parse_client_event(text)
    assert isinstance(event, CreateEvent)
    assert isinstance(in_place, CreateEvent)
    assert not event.items.decoded  # nothing decoded here until something asks
    assert event.items.fragment == in_place.items.fragment
    assert (event.fields, event.stream_id, event.tools, event.size) == (
        in_place.fields,
        in_place.stream_id,
        in_place.tools,
        in_place.size,
    )
    assert event.new_input == in_place.new_input  # decoded on demand, equal


def test_a_refusal_from_the_worker_keeps_everything_it_says() -> None:
    text = big_create(60_000, stream_id="lane", background=True)
    with pytest.raises(ProtocolError) as refused:
        asyncio.run(parse_frame(text))
    assert refused.value.code == "unsupported_parameter"
    assert refused.value.param == "background"
    assert refused.value.stream_id == "lane"
    assert refused.value.on_lane


def test_other_sockets_keep_being_served_while_a_large_frame_is_parsed() -> None:
    """The longest the event loop is held while a large frame is parsed off it is a small
    part of what parsing it in place holds it for."""
    text = big_create(400_000)
    started = time.perf_counter()
    parse_client_event(text)
    in_place = time.perf_counter() - started

    async def scenario() -> float:
        await parse_frame(big_create(60_000))  # the pool's processes start once
        longest = 0.0
        done = asyncio.Event()

        async def tick() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.01)
        await parse_frame(text)
        done.set()
        await ticker
        return longest

    longest = asyncio.run(scenario())
    assert longest < in_place / 4, f"held {longest * 1000:.0f} ms; in place {in_place * 1000:.0f}"
