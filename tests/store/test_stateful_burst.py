"""Many large stateful `POST`s at once, against a real uvicorn server in a child process:
32 bodies of about 3 MiB (over the size parsed in helper processes), half of them continuing a
stored response. The helper processes stay within their bound, none is left a zombie, no file
descriptor is left open, and the server's event loop is never held for long (its thread's CPU
time between two ticks, against what parsing one such body in place takes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.servers import ROOT
from tests.store_kit import wait_for
from ws_mode._frames import OFF_LOOP_BYTES, WORKERS
from ws_mode.testing._loopback import bind_loopback, origin

#: What a helper process runs (`ws_mode._frames._HELPER`): how one is told from other children.
HELPER_MARK = b"from ws_mode._frames import serve"


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended
            continue
    return found


def helpers(pid: int) -> list[int]:
    """The helper processes of `pid` (a zombie's cmdline is empty: see `zombies`)."""
    found = []
    for child in children(pid):
        try:
            if HELPER_MARK in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def zombies(pid: int) -> list[int]:
    """The children of `pid` that ended and were never waited for (state Z)."""
    found = []
    for child in children(pid):
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except FileNotFoundError:
            continue
        if "\nState:\tZ" in status:
            found.append(child)
    return found


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    """uvicorn running `tests.stateful_burst_app:app` in a child process, on a socket bound
    here (no port to race for); its base URL and pid."""
    listener = bind_loopback()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "uvicorn", "tests.stateful_burst_app:app",
        "--fd", str(listener.fileno()), "--lifespan", "on", "--log-level", "warning",
    ]  # fmt: skip
    child = subprocess.Popen(command, cwd=ROOT, env=env, pass_fds=(listener.fileno(),))
    base_url = origin(listener)
    listener.close()  # the child holds its copy
    try:
        assert wait_for(lambda: _answers(base_url), timeout=20), "the server did not start"
        yield base_url, child.pid
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/probe", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def big_body(items: int, **fields: Any) -> bytes:
    """A create of `items` tiny input items: costly to parse for its size."""
    inputs = [{"role": "user", "content": f"x{n}"} for n in range(items)]
    return orjson.dumps({"model": "m", "input": inputs, "store": False, **fields})


def test_many_large_stateful_posts_at_once(server: tuple[str, int]) -> None:
    base_url, pid = server
    # A stored response to continue (small), and the helpers started once (not measured).
    first = httpx.post(f"{base_url}/v1/responses", json={"model": "m", "input": "Start"}).json()
    warm = httpx.post(f"{base_url}/v1/responses", content=big_body(40_000), timeout=30)
    assert warm.status_code == 200, warm.text
    bodies = [big_body(70_000), big_body(90_000, previous_response_id=first["id"])]
    assert all(4 << 20 > len(body) >= max(2 << 20, OFF_LOOP_BYTES) for body in bodies)
    assert wait_for(lambda: len(helpers(pid)) >= 1)
    fds_before, helpers_before = descriptors(pid), len(helpers(pid))
    most_helpers, seen_zombies = 0, set[int]()
    sampling = True

    def sample() -> None:
        nonlocal most_helpers
        while sampling:
            most_helpers = max(most_helpers, len(helpers(pid)))
            seen_zombies.update(zombies(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    httpx.get(f"{base_url}/probe")  # a new measure starts

    try:
        answers = asyncio.run(burst(base_url, bodies))
        probe = httpx.get(f"{base_url}/probe").json()
    finally:
        sampling = False
        sampler.join()
    assert [answer.status_code for answer in answers] == [200] * 32
    continued = [answer.json().get("previous_response_id") for answer in answers[1::2]]
    assert continued == [first["id"]] * 16
    # Bounded helpers, none left a zombie, no descriptor left open.
    assert 1 <= most_helpers <= WORKERS
    helpers_after = len(helpers(pid))
    assert 1 <= helpers_after <= WORKERS
    assert seen_zombies == set()
    assert zombies(pid) == []
    # Two pipes' ends per helper started meanwhile; the rest as before.
    fds_after = fds_before + 2 * (helpers_after - helpers_before)
    assert wait_for(lambda: descriptors(pid) == fds_after), (descriptors(pid), fds_after)
    # A helper killed while idle (an OOM kill) is reaped at once, with no request to find it;
    # the next large body gets a new one.
    victim = helpers(pid)[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: not Path(f"/proc/{victim}").exists()), f"{victim}: {zombies(pid)}"
    assert len(helpers(pid)) == helpers_after - 1
    again = httpx.post(f"{base_url}/v1/responses", content=bodies[0], timeout=30)
    assert again.status_code == 200, again.text
    assert 1 <= len(helpers(pid)) <= WORKERS
    assert zombies(pid) == []
    # The same burst with every body parsed on the event loop, for comparison.
    httpx.get(f"{base_url}/probe?in_place=1")
    assert all(answer.status_code == 200 for answer in asyncio.run(burst(base_url, bodies)))
    in_place = httpx.get(f"{base_url}/probe?in_place=0").json()
    # The loop kept ticking, and never held on for long: a tick's gap is the work of every
    # request ready at once (reading 32 bodies).
    assert probe["ticks"] > 32
    longest, held = probe["longest"], in_place["longest"]
    assert longest < held / 5, f"held {longest * 1000:.0f} ms; in place {held * 1000:.0f}"


async def burst(base_url: str, bodies: list[bytes]) -> list[httpx.Response]:
    """32 `POST`s at once, on 32 connections, of `bodies` in turn."""
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(client.post("/v1/responses", content=bodies[n % 2]) for n in range(32))
        )
