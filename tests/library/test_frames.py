"""Large frames are parsed off the event loop, and come out as if parsed in place."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import orjson
import pytest

from ws_mode import _frames as frames
from ws_mode._client_events import CreateEvent, ProtocolError, parse_client_event
from ws_mode._frames import OFF_LOOP_BYTES, HelperDied, in_helper, parse_frame

T = TypeVar("T")


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
    """The most the event loop works at a stretch while a large frame is parsed off it is a
    small part of what parsing it in place takes."""
    text = big_create(400_000)
    in_place = _in_place_seconds(text)

    async def scenario() -> float:
        await parse_frame(big_create(60_000))  # the pool's processes start once
        _, longest = await _longest_stall(parse_frame(text))
        return longest

    longest = asyncio.run(scenario())
    assert longest < in_place / 4, f"held {longest * 1000:.0f} ms; in place {in_place * 1000:.0f}"


async def _longest_stall(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s result, and the most CPU time the event loop's thread spent between two of its
    ticks while it ran: what a callback holding the loop (a frame parsed in place) takes from
    the other sockets. The thread's own CPU time, not the wall clock: on a busy machine the
    loop also waits its turn for a core, which is no stall of ours."""
    longest = 0.0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal longest
        last = time.thread_time()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.thread_time()
            longest = max(longest, now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    try:
        result = await work
    finally:
        done.set()
        await ticker
    return result, longest


def _in_place_seconds(text: str) -> float:
    """The CPU time parsing `text` on this thread takes."""
    started = time.thread_time()
    parse_client_event(text)
    return time.thread_time() - started


@pytest.mark.parametrize("when", ["idle", "parsing"])
def test_a_killed_helper_is_replaced_and_large_frames_stay_off_the_loop(when: str) -> None:
    """An OOM-killed helper (idle, or with a frame in hand) is replaced: the frame it held and
    the next ones are parsed by a new helper, never on the event loop."""
    text = big_create(250_000)
    in_place = _in_place_seconds(text)

    async def scenario() -> tuple[set[int], set[int], list[object], float]:
        await parse_frame(big_create(60_000))  # helpers start
        before = set(frames._POOL.pids())
        assert before
        if when == "idle":
            for pid in before:
                os.kill(pid, signal.SIGKILL)

        async def parse_twice() -> list[object]:
            first = asyncio.create_task(parse_frame(text))
            if when == "parsing":
                await asyncio.sleep(0.05)  # the frame is with a helper (or on its way)
                for pid in before:
                    os.kill(pid, signal.SIGKILL)
            return [await first, await parse_frame(text)]

        events, longest = await _longest_stall(parse_twice())
        return before, set(frames._POOL.pids()), events, longest

    before, after, events, longest = asyncio.run(scenario())
    assert after
    assert not after & before
    in_place_event = parse_client_event(text)
    assert isinstance(in_place_event, CreateEvent)
    for event in events:
        assert isinstance(event, CreateEvent)
        assert event.items.fragment == in_place_event.items.fragment
    assert longest < in_place / 4, f"held {longest * 1000:.0f} ms; in place {in_place * 1000:.0f}"


def test_a_request_that_kills_its_helpers_twice_is_refused_not_run_in_place() -> None:
    async def scenario() -> None:
        with pytest.raises(HelperDied):
            await in_helper(os._exit, 9)  # the helper dies with it, and so does the next
        event = await parse_frame(big_create(60_000))  # later frames still parse in helpers
        assert isinstance(event, CreateEvent)
        assert not event.items.decoded

    asyncio.run(scenario())


def test_large_frames_do_not_wait_for_the_default_executor() -> None:
    """The event loop's default executor (name lookups use it) may be busy; frames still
    parse, in the pool's own threads."""
    release = threading.Event()

    async def scenario() -> object:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))
        blockers = [loop.run_in_executor(None, release.wait) for _ in range(4)]
        try:
            return await asyncio.wait_for(parse_frame(big_create(60_000)), timeout=20)
        finally:
            release.set()
            await asyncio.gather(*blockers)

    assert isinstance(asyncio.run(scenario()), CreateEvent)


def test_helpers_that_cannot_start_are_tried_again_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """After `MAX_FAILURES` failed starts large frames are parsed in place for a while, then
    helpers are started again (never off for good)."""
    pool = frames._Pool()
    monkeypatch.setattr(frames, "_POOL", pool)
    monkeypatch.setattr(frames, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(frames.sys, "executable", "/nonexistent/python")
    text = big_create(60_000)

    async def scenario() -> None:
        for _ in range(frames.MAX_FAILURES):
            assert isinstance(await parse_frame(text), CreateEvent)  # in place
        assert not pool.available()
        monkeypatch.undo()
        monkeypatch.setattr(frames, "_POOL", pool)
        await asyncio.sleep(0.3)
        assert pool.available()
        event = await parse_frame(text)
        assert isinstance(event, CreateEvent)
        assert not event.items.decoded
        assert pool.pids()

    try:
        asyncio.run(scenario())
    finally:
        pool.stop()


def test_a_frame_whose_helpers_died_is_answered_with_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frame that took two helpers down is refused with a server error the client sees
    (never parsed on the loop, never dropped silently). The deaths are stood in for: no
    real frame kills a helper on demand (the deaths themselves are tested above)."""

    async def died(*_: object) -> object:
        raise HelperDied

    monkeypatch.setattr(frames, "in_helper", died)
    with pytest.raises(ProtocolError) as refused:
        asyncio.run(parse_frame(big_create(60_000)))
    assert refused.value.code == "server_error"
    assert refused.value.status == 500
    assert refused.value.event()["error"]["type"] == "server_error"
