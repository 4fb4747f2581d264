"""The load's clients: sockets running a chain on each lane (:func:`run_client`), the same
conversations over plain HTTP (:func:`run_http_client`), and one side's round against the server
(:func:`run_side`). What only the clients use is imported where a client is made."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ws_mode._sse import SSEDecoder
from ws_mode.toolkit.measure import PeakSampler

from .chains import INSTRUCTIONS, TOOL, Chain
from .options import LoadOptions
from .report import SideReport
from .server import PING_PATH, RESET_PATH, SOCKET_PATH, STATS_PATH

if TYPE_CHECKING:
    import httpx

    from ws_mode.testing._client import AsyncSocket
    from ws_mode.toolkit.http_client import HttpClient


# ----------------------------------------------------------------------------- the sockets
# `run_client` opens one socket (the kit's AsyncSocket, its lanes demultiplexed by stream_id)
# and runs a chain on each of its lanes concurrently, counting in a Tally what it saw.


@dataclass
class Tally:
    """What the clients saw."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    turns: int = 0
    connected: int = 0
    settled: int = 0  # connection attempts that succeeded or failed
    lanes: int = 0
    expected: int = 0
    all_settled: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set at the duration cap: clients stop at their next step (a task cancelled inside
    #: `websockets`' connect() may go on as if it was not).
    stopped: bool = False

    def settle(self) -> None:
        """Count one connection attempt as over (it succeeded or failed)."""
        self.settled += 1
        if self.settled == self.expected:
            self.all_settled.set()

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {detail[:300]}")


async def _lane(
    sock: AsyncSocket, tag: str, lane: str | None, chain: Chain, options: LoadOptions, tally: Tally
) -> None:
    from ws_mode.testing._client import SocketClosed

    where = f"{tag} lane {lane}"
    previous: str | None = None
    for step in range(options.turns):
        if tally.stopped:
            return
        create: dict[str, Any] = {
            "type": "response.create",
            "model": "reference",
            "input": chain.inputs[step],
            "tools": [TOOL],
            "instructions": INSTRUCTIONS,
        }
        if lane is not None:
            create["stream_id"] = lane
        if previous is not None:
            create["previous_response_id"] = previous
        started = time.perf_counter()
        await sock.send(create)
        try:
            async with asyncio.timeout(options.turn_timeout):
                event = (await sock.receive_turn(lane))[-1]
        except TimeoutError:
            tally.error("turn_timeout", f"{where} turn {step + 1}")
            return
        except SocketClosed:
            tally.error("socket_closed", f"{where} turn {step + 1}")
            return
        tally.latencies.append(time.perf_counter() - started)
        if event["type"] == "error":
            tally.error(f"error:{event['error'].get('code')}", f"{where}: {event}")
            return
        response = event["response"]
        if event["type"] != "response.completed":
            tally.error(event["type"], f"{where}: {response.get('status')}")
            return
        if response.get("previous_response_id") != previous:
            tally.error("previous_response_id", f"{where} turn {step + 1}")
        if response["output"] != chain.outputs[step]:
            tally.error(
                "wrong_output",
                f"{where} turn {step + 1}: {response['output']} != {chain.outputs[step]}",
            )
            return
        tally.turns += 1
        previous = response["id"]


async def run_client(
    index: int,
    base_url: str,
    options: LoadOptions,
    chains: list[Chain],
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
) -> None:
    """Connection number `index`: open its socket (at most `gate` opening at once), wait for
    `start`, then run a chain on each of its lanes concurrently."""
    from ws_mode.testing._client import connect_async

    count = options.lanes_of(index)
    lanes: list[str | None] = [None, *(f"lane-{lane}" for lane in range(1, count))]
    tag = f"connection {index}"
    try:
        async with gate:
            sock = await connect_async(
                base_url, SOCKET_PATH, open_timeout=60, compression=options.compression
            )
    except Exception as exc:
        tally.error(f"connect:{type(exc).__name__}", f"{tag}: {exc}")
        return
    finally:
        tally.settle()
    if tally.stopped:
        await sock.close()
        return
    tally.connected += 1
    sock.demultiplex(lanes, lambda kind, detail: tally.error(kind, f"{tag}: {detail}"))
    try:
        await start.wait()
        tally.lanes += len(lanes)
        await asyncio.gather(
            *(
                _lane(sock, tag, lane, chains[options.variant_of(index, number)], options, tally)
                for number, lane in enumerate(lanes)
            )
        )
    except Exception as exc:
        tally.error(f"client:{type(exc).__name__}", f"{tag}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await sock.close()


# ----------------------------------------------------------------------------- over HTTP
# HTTP client number `index` stands for socket number `index`: one httpx.AsyncClient whose pool
# holds as many keep-alive connections as that socket has lanes, all opened (GET PING_PATH,
# concurrently) before the first turn, so each conversation has its own HTTP/1.1 connection, as
# a client pool sized to its concurrency would. Each conversation runs the same chain as the lane
# it stands for, one streamed POST per turn with the whole history so far, its SSE body decoded
# by the core's SSEDecoder. The request bodies are encoded once per chain and turn before the
# load (`history_bodies`), so the client's JSON encoding is not measured.


HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


def history_bodies(chains: list[Chain]) -> list[list[bytes]]:
    """For each chain, each turn's request body: the whole history up to that turn."""
    bodies: list[list[bytes]] = []
    for chain in chains:
        history: list[dict[str, Any]] = []
        turns: list[bytes] = []
        for new_input, output in zip(chain.inputs, chain.outputs, strict=True):
            history.extend(new_input)
            body = {
                "model": "reference",
                "input": history,
                "tools": [TOOL],
                "instructions": INSTRUCTIONS,
                "stream": True,
            }
            turns.append(orjson.dumps(body))
            history.extend(output)
        bodies.append(turns)
    return bodies


async def _turn(client: httpx.AsyncClient, body: bytes) -> dict[str, Any] | None:
    """One streamed turn: its last event (None when the stream had none)."""
    from ws_mode.testing._client import decode_event
    from ws_mode.toolkit.http_client import DONE, HttpStatusError

    last: dict[str, Any] | None = None
    async with client.stream("POST", SOCKET_PATH, content=body, headers=HEADERS) as answer:
        if answer.status_code != 200:
            raise HttpStatusError(answer.status_code, await answer.aread())
        decoder = SSEDecoder()
        async for chunk in answer.aiter_bytes():
            for _, data in decoder.feed(chunk):
                if data != DONE:
                    last = decode_event(data)
    return last


async def _conversation(
    client: httpx.AsyncClient,
    where: str,
    chain: Chain,
    bodies: list[bytes],
    options: LoadOptions,
    tally: Tally,
) -> None:
    import httpx

    from ws_mode.toolkit.http_client import HttpStatusError

    for step in range(options.turns):
        if tally.stopped:
            return
        started = time.perf_counter()
        try:
            async with asyncio.timeout(options.turn_timeout):
                event = await _turn(client, bodies[step])
        except TimeoutError:
            tally.error("turn_timeout", f"{where} turn {step + 1}")
            return
        except (httpx.HTTPError, HttpStatusError, ValueError) as exc:
            tally.error(f"http:{type(exc).__name__}", f"{where} turn {step + 1}: {exc}")
            return
        tally.latencies.append(time.perf_counter() - started)
        if event is None or event.get("type") != "response.completed":
            tally.error(
                "no_completed_event" if event is None else str(event.get("type")),
                f"{where} turn {step + 1}: {event}",
            )
            return
        output = event["response"]["output"]
        if output != chain.outputs[step]:
            tally.error(
                "wrong_output", f"{where} turn {step + 1}: {output} != {chain.outputs[step]}"
            )
            return
        tally.turns += 1


async def run_http_client(
    index: int,
    base_url: str,
    options: LoadOptions,
    chains: list[Chain],
    bodies: list[list[bytes]],
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
    tls: ssl.SSLContext,
) -> None:
    """Client number `index`: open one keep-alive connection per lane socket `index` has (at
    most `gate` clients opening at once), wait for `start`, then run each lane's chain over
    HTTP concurrently. `tls` is one context shared by every client (never used on loopback;
    httpx would otherwise build one per client)."""
    import httpx

    from ws_mode.toolkit.http_client import HttpStatusError

    count = options.lanes_of(index)
    tag = f"http client {index}"
    # No keep-alive expiry: a connection waits idle while the other clients connect.
    limits = httpx.Limits(
        max_connections=count, max_keepalive_connections=count, keepalive_expiry=None
    )
    timeout = httpx.Timeout(options.turn_timeout, connect=60.0, pool=options.turn_timeout)
    client = httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, verify=tls)
    try:
        try:
            async with gate:
                # Concurrent requests on an empty pool each open a connection of their own.
                answers = await asyncio.gather(*(client.get(PING_PATH) for _ in range(count)))
            if any(answer.status_code != 204 for answer in answers):
                raise HttpStatusError(answers[0].status_code, answers[0].content)
        except Exception as exc:
            tally.error(f"connect:{type(exc).__name__}", f"{tag}: {exc}")
            return
        finally:
            tally.settle()
        if tally.stopped:
            return
        tally.connected += count
        await start.wait()
        tally.lanes += count
        variants = [options.variant_of(index, lane) for lane in range(count)]
        await asyncio.gather(
            *(
                _conversation(client, f"{tag} lane {lane}", chains[v], bodies[v], options, tally)
                for lane, v in enumerate(variants)
            )
        )
    except Exception as exc:
        tally.error(f"client:{type(exc).__name__}", f"{tag}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


# ----------------------------------------------------------------------------- one side
# `run_side` runs one round of the sockets or of HTTP: every client connected, then every turn
# at once. It adds to that side's SideReport the turns, errors, latencies, and, from the first
# turn to the last client's end, the seconds, the server's CPU time (read from STATS_PATH) and
# this process's, and the server's RSS once the previous side's memory was released, and its
# peak (VmHWM), both through RESET_PATH before the side connects.


#: How long a side waits for the server to close the sockets its clients closed.
CLOSE_WAIT_SECONDS = 5.0


@dataclass
class Probe:
    """The load server's stats routes, called off the event loop."""

    http: HttpClient

    async def state(self) -> dict[str, Any]:
        """``GET /load/stats``: pid, open sockets, memory, CPU time, HTTP connections seen."""
        return await asyncio.to_thread(self.http.get_json, STATS_PATH)

    async def reset(self) -> None:
        """``POST /load/reset``: the peak RSS and the HTTP connections seen start over."""
        await asyncio.to_thread(self.http.post_json, RESET_PATH)


@dataclass
class Load:
    """What every side of a run shares: where the server is, the options, the chains and
    their HTTP bodies, the run's deadline."""

    base_url: str
    pid: int
    options: LoadOptions
    chains: list[Chain]
    bodies: list[list[bytes]]
    deadline: float
    probe: Probe


async def run_side(load: Load, side: SideReport) -> None:
    """Run one round of `side` (its ``transport``), adding what it measured to it."""
    options = load.options
    await load.probe.reset()
    rss_start = (await load.probe.state())["memory"]["rss"] or 0
    sampler = PeakSampler(load.pid)
    sampler.start()
    tally = Tally(expected=options.connections)
    gate = asyncio.Semaphore(options.connect_concurrency)
    start = asyncio.Event()
    tls = ssl.create_default_context()
    clients = [
        asyncio.create_task(_client(load, side.transport, index, tally, gate, start, tls))
        for index in range(options.connections)
    ]
    try:
        # Every client is connected before the first turn starts.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.1, load.deadline - time.monotonic())):
                await tally.all_settled.wait()
        before = await load.probe.state()
        client_cpu = time.process_time()
        began = time.perf_counter()
        start.set()
        left = max(0.1, load.deadline - time.monotonic())
        _done, pending = await asyncio.wait(clients, timeout=left)
        seconds = time.perf_counter() - began
        client_cpu = time.process_time() - client_cpu
        after = await load.probe.state()
        if pending:
            tally.error("duration", f"{len(pending)} clients still running at the cap")
    finally:
        tally.stopped = True
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        sampler.stop()
    closed = await _closed(load.probe)
    if closed["connections"] != 0:
        tally.error("connections_left_open", f"{closed['connections']} sockets still open")
    if side.transport == "websocket":
        seen = before["connections"]  # open at once, before the first turn
        side.server_connections = seen if not side.rounds else min(side.server_connections, seen)
    else:
        side.server_connections = max(side.server_connections, after["http_connections"])
    side.rounds += 1
    side.connections_expected = (
        options.connections if side.transport == "websocket" else options.conversations
    )
    side.connections += tally.connected
    side.conversations = max(side.conversations, tally.lanes)
    side.turns += tally.turns
    side.turns_expected += options.turns * options.conversations
    side.seconds += seconds
    side.latencies.extend(tally.latencies)
    for kind, count in tally.errors.items():
        side.errors[kind] = side.errors.get(kind, 0) + count
    side.error_samples.extend(tally.samples[: max(0, 20 - len(side.error_samples))])
    side.server_cpu_seconds += after["cpu_seconds"] - before["cpu_seconds"]
    side.client_cpu_seconds += client_cpu
    peak = max(closed["memory"]["peak"] or 0, sampler.peak)
    side.rss_rounds.append([rss_start, peak])
    side.rss_start = max(side.rss_start, rss_start)
    side.rss_peak = max(side.rss_peak, peak)


def _client(
    load: Load,
    transport: str,
    index: int,
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
    tls: ssl.SSLContext,
) -> Coroutine[Any, Any, None]:
    if transport == "websocket":
        return run_client(index, load.base_url, load.options, load.chains, tally, gate, start)
    return run_http_client(
        index, load.base_url, load.options, load.chains, load.bodies, tally, gate, start, tls
    )


async def _closed(probe: Probe) -> dict[str, Any]:
    """The server's state once it closed the sockets the clients closed (or gave up)."""
    state = await probe.state()
    deadline = time.monotonic() + CLOSE_WAIT_SECONDS
    while state["connections"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        state = await probe.state()
    return state
