"""The load test of WebSocket mode: hundreds of sockets running tool-call chains at once, and the
same conversations over plain HTTP at the same concurrency, against the same server process.

``python -m benchmarks.load --connections 300 --turns 5 --lanes 4`` starts the load
server (the reference server, :mod:`ws_mode.toolkit.reference`, behind
:class:`~ws_mode.WebSocketModeMiddleware` under uvicorn) in a subprocess on loopback: this same
module, run as ``python -m benchmarks.load --serve --spec JSON --fd N`` through
:func:`ws_mode.testing._loopback.server_process`, which binds the loopback socket and passes it
down (:func:`build_load_app`, :func:`serve`). Then it opens ``--connections`` sockets (the
asyncio ``websockets`` client), all of them before any turn starts. Each socket runs one
tool-call chain of ``--turns`` turns on each of its lanes (1 to ``--lanes``, the default lane and
named ones, concurrently): a user message, then ``turns - 1`` times the model asks for a tool
and the client answers with a ``--tool-output-bytes`` output, the last turn is the model's final
answer (:func:`run_client`).

``--long`` makes the chains an agent's with longer histories: 25 turns, 4 KiB tool outputs, one
lane per socket (about 100 KiB of history by the last turn).

Then (unless ``--no-http``) the same conversations run over plain HTTP
(:func:`run_http_client`): one keep-alive connection per conversation, all opened before any
turn starts, each turn a streamed ``POST /v1/responses`` with the whole history. With
``--rounds N`` the two sides alternate: sockets then HTTP in the first round, HTTP then sockets
in the second, and so on (:func:`run_side`); each side's figures add up over its rounds.

Every turn is checked on both sides: its output must be exactly what the reference model gives
for that context over plain HTTP (the model is deterministic per context; each distinct chain
is run once over HTTP with the whole history first, :func:`reference_chains`), a socket turn's
events must carry its lane's ``stream_id``, and no error may arrive. The report
(:class:`LoadReport`) gives, per side, connections, turns, turns/s, p50/p99/max turn latency
(request sent to terminal event received), errors, the server's and this process's CPU time per
turn, the server's peak RSS, and the ratios WebSocket/HTTP; then the middleware's counters and
the server's RSS at rest. The sockets' peak RSS must stay under a bound derived from the cache
limits (:func:`rss_bound`): the run fails when it does not.

Loopback only, bounded in count and time (``--duration`` caps the whole run); the server
subprocess is always killed, and kills itself if this process dies.

It is one concept, the load test, in one module: its options, the server it loads, the two
kinds of client, a side's round and the report are each other's only users, and they share the
one protocol between them (the chains, the stats routes, the paths). The server's process
imports this module too, so what only the clients use (the kit's socket client, the tools' HTTP
client, httpx) is imported where a client is made: the server imports what it imported on its
own, its RSS being what the test measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import ssl
import sys
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ws_mode._cache import NODE_OVERHEAD
from ws_mode._gc import GC_THRESHOLD, tune_gc
from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode._sse import SSEDecoder
from ws_mode.testing._loopback import (
    WS_IMPLEMENTATIONS,
    ServerProcess,
    ServerStartError,
    add_child_arguments,
    serve_inherited,
)
from ws_mode.testing._loopback import server_process as loopback_process
from ws_mode.toolkit.measure import PeakSampler, format_bytes, memory, percentile, reset_peak_rss

if TYPE_CHECKING:
    import httpx

    from ws_mode.testing._client import AsyncSocket
    from ws_mode.toolkit.http_client import HttpClient

__all__ = [
    "CACHE_OVERHEAD_FACTOR",
    "LONG_TOOL_OUTPUT_BYTES",
    "LONG_TURNS",
    "PER_CONNECTION_BYTES",
    "PING_PATH",
    "RATIOS",
    "RESET_PATH",
    "SLACK_BYTES",
    "SOCKET_PATH",
    "STATS_PATH",
    "VARIANTS",
    "Chain",
    "Load",
    "LoadError",
    "LoadOptions",
    "LoadReport",
    "Probe",
    "SideReport",
    "Tally",
    "build_load_app",
    "build_parser",
    "check_file_limit",
    "first_input",
    "history_bodies",
    "main",
    "options_from",
    "raise_file_limit",
    "reference_chains",
    "rss_bound",
    "run",
    "run_client",
    "run_http_client",
    "run_load",
    "run_side",
    "serve",
    "server_process",
    "tool_output",
]


# ----------------------------------------------------------------------------- the options


#: Chains differ by their first user message; this many distinct ones are run (and checked
#: over HTTP once each).
VARIANTS: Final = 8

# Bounds of the command line: a load test, not a denial of service.
MAX_CONNECTIONS: Final = 2000
MAX_TURNS: Final = 200
MAX_LANES: Final = 16
MAX_TOOL_OUTPUT_BYTES: Final = 1024 * 1024
MAX_DURATION: Final = 3600.0
MAX_ROUNDS: Final = 20
#: ``--long``: the chains of an agent with longer histories (about 100 KiB by the last turn),
#: where HTTP re-sends and re-reads the whole history every turn.
LONG_TURNS: Final = 25
LONG_TOOL_OUTPUT_BYTES: Final = 4096

# The memory model of `rss_bound` (see there). Measured on CPython 3.11, uvicorn 0.54 with
# websockets 15 (permessage-deflate on, as the openai SDK asks), glibc malloc:
#: What one open socket costs the server beyond its cache: uvicorn's protocol object and its
#: buffers, the websockets state machine and its deflate contexts, the ASGI queues, ws_mode's
#: Connection and its tasks. Measured: 100 KiB per socket (600 sockets, one turn each).
PER_CONNECTION_BYTES: Final = 160 * 1024
#: What one byte the caches count (their encoded items and response objects) costs in RSS,
#: together with the turns in flight: each cached response keeps its items both encoded (the
#: bytes counted) and decoded (dicts and strings), its response object decoded, its rendered
#: tokens (with a renderer), plus the request bodies and handler work of running turns.
#: Measured: 3.5 with full_context="always", 5.1 with "on_miss" and the reference renderer
#: (300 sockets x 2.5 lanes x 10 turns x 8 KiB tool outputs), once cached fragments are
#: exact-size (see docs/limits.md: orjson's over-allocated output multiplies this by up to 16).
CACHE_OVERHEAD_FACTOR: Final = 6.0
#: The allocator's arenas and fragmentation, the client threads of the HTTP reference run.
SLACK_BYTES: Final = 64 * 1024 * 1024


class LoadError(Exception):
    """The load test could not run (the server did not start, a bad option)."""


@dataclass(frozen=True)
class LoadOptions:
    """What one load run does (see the module docstring and ``--help``)."""

    connections: int = 300
    turns: int = 5
    lanes: int = 4
    tool_output_bytes: int = 1024
    duration: float = 300.0
    full_context: str = "always"
    tokens_per_second: float = 0.0
    max_cached_bytes: int = 8 * 1024 * 1024
    max_cached_responses: int = 512
    connect_concurrency: int = 64
    turn_timeout: float = 60.0
    #: Also run the same conversations over plain HTTP (full history, SSE) at the same
    #: concurrency, against the same server process.
    http: bool = True
    #: Whether the sockets ask for permessage-deflate (the openai SDK does).
    compression: bool = True
    #: Rounds of both sides; even rounds run the sockets first, odd ones HTTP first.
    rounds: int = 1
    #: The server's uvicorn WebSocket implementation, as ``ws-mode serve --ws`` names it.
    ws: str = "batched"
    #: The server's garbage collector, as ``ws-mode serve`` sets it (``ws_mode.tune_gc``
    #: with this threshold); 0 leaves Python's as it is.
    gc_threshold: int = GC_THRESHOLD

    def __post_init__(self) -> None:
        checks = (
            ("connections", self.connections, 1, MAX_CONNECTIONS),
            ("turns", self.turns, 1, MAX_TURNS),
            ("lanes", self.lanes, 1, MAX_LANES),
            ("tool_output_bytes", self.tool_output_bytes, 1, MAX_TOOL_OUTPUT_BYTES),
            ("duration", self.duration, 1.0, MAX_DURATION),
            ("connect_concurrency", self.connect_concurrency, 1, MAX_CONNECTIONS),
            ("max_cached_bytes", self.max_cached_bytes, 1024, 1 << 40),
            ("max_cached_responses", self.max_cached_responses, 1, 1 << 20),
            ("turn_timeout", self.turn_timeout, 0.1, MAX_DURATION),
            ("rounds", self.rounds, 1, MAX_ROUNDS),
            ("gc_threshold", self.gc_threshold, 0, 1 << 30),
        )
        for name, value, low, high in checks:
            if not low <= value <= high:
                raise LoadError(f"{name} must be between {low} and {high}, got {value}.")
        if self.full_context not in ("always", "on_miss"):
            raise LoadError(
                f"full_context must be 'always' or 'on_miss', not {self.full_context!r}."
            )
        if self.tokens_per_second < 0:
            raise LoadError("tokens_per_second must be >= 0.")

    def lanes_of(self, connection: int) -> int:
        """How many lanes connection number `connection` runs: 1 to `lanes`, in turn."""
        return 1 + connection % self.lanes

    @property
    def conversations(self) -> int:
        """How many conversations run at once: the lanes of every socket."""
        return sum(self.lanes_of(index) for index in range(self.connections))

    def variant_of(self, connection: int, lane: int) -> int:
        """Which of the :data:`VARIANTS` chains lane number `lane` of `connection` runs."""
        return (connection * self.lanes + lane) % VARIANTS


def rss_bound(rss_at_rest: int, connections: int, cache_bytes: int) -> int:
    """The most the server's RSS may reach: at rest, plus each open socket's fixed cost, plus
    what its caches count times the cost of a counted byte, plus slack (the constants above).

    `cache_bytes` is the sum over connections of what each cache counts: the bytes of every
    turn of its chains, at most `max_cached_bytes` per connection. So the bound grows with the
    cache limits and the open sockets, never with the number of turns served. The load's
    conversations fit their caches, so nothing is evicted (a cache that evicts keeps the
    evicted ancestors of live responses alive, which this bound does not cover).
    """
    return int(
        rss_at_rest
        + connections * PER_CONNECTION_BYTES
        + cache_bytes * CACHE_OVERHEAD_FACTOR
        + SLACK_BYTES
    )


# ----------------------------------------------------------------------------- the server
# The load server's process runs `serve`. Besides the reference Responses server at
# SOCKET_PATH (WebSocket mode included), it answers GET STATS_PATH: its pid, its open sockets,
# its memory (ws_mode.toolkit.measure.memory), its CPU time, the middleware's counters, and how
# many distinct HTTP connections (client ports) sent it requests; POST RESET_PATH hands the
# memory the previous side freed back to the system and starts the peak RSS and that count over
# (before each side of the load); GET PING_PATH answers 204 (the HTTP side opens its keep-alive
# connections with it).


STATS_PATH: Final = "/load/stats"
RESET_PATH: Final = "/load/reset"
PING_PATH: Final = "/load/ping"
SOCKET_PATH: Final = "/v1/responses"
BACKLOG: Final = 4096


def raise_file_limit() -> int:
    """Allow as many open files as the hard limit does (each socket is one); the soft limit
    now in force (-1: unlimited, or not known)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return -1 if soft == resource.RLIM_INFINITY else int(soft)
    return -1


def release_memory() -> bool:
    """Collect garbage and give the free heap back to the system (glibc's ``malloc_trim``);
    False where there is no ``malloc_trim``."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
        return True
    return False


def build_load_app(spec: dict[str, Any]) -> ASGIApp:
    """The reference app behind the middleware as the spec (the load's options) sets it, and
    the stats, reset and ping routes."""
    from ws_mode.toolkit.reference import ReferenceConfig, create_app, render_items

    config = ReferenceConfig(
        tool_calls=int(spec["turns"]) - 1, tokens_per_second=float(spec["tokens_per_second"])
    )
    middleware = WebSocketModeMiddleware(
        create_app(config, path=SOCKET_PATH),
        full_context=spec["full_context"],
        renderer=render_items if spec["full_context"] == "on_miss" else None,
        limits=Limits(
            max_connections=int(spec["connections"]) + 16,
            max_cached_bytes=int(spec["max_cached_bytes"]),
            max_cached_responses=int(spec["max_cached_responses"]),
        ),
    )

    peers: set[Any] = set()  # the HTTP connections seen since the last reset

    def state() -> bytes:
        stats = getattr(middleware, "stats", None)
        return orjson.dumps(
            {
                "pid": os.getpid(),
                "connections": middleware.connections,
                "memory": asdict(memory()),
                "cpu_seconds": time.process_time(),
                "http_connections": len(peers),
                "stats": stats.snapshot() if stats is not None else {},
            }
        )

    async def answer(send: Send, status: int, body: bytes = b"") -> None:
        headers = [(b"content-type", b"application/json")] if body else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == STATS_PATH:
                await answer(send, 200, state())
                return
            if path == RESET_PATH:
                peers.clear()
                trimmed = release_memory()
                reset = {"trimmed": trimmed, "peak_reset": reset_peak_rss()}
                await answer(send, 200, orjson.dumps(reset))
                return
            peers.add(tuple(scope.get("client") or ()))
            if path == PING_PATH:
                await answer(send, 204)
                return
        await middleware(scope, receive, send)

    return app


def serve(argv: Sequence[str]) -> int:
    """The load server's process: ``python -m benchmarks.load --serve --spec JSON
    --fd N`` (started by :func:`server_process`) serves :func:`build_load_app` on the parent's
    socket."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load --serve")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--spec", required=True, help="the load's options as JSON")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    raise_file_limit()
    spec = json.loads(args.spec)
    app = build_load_app(spec)
    if spec.get("gc_threshold"):
        tune_gc(spec["gc_threshold"])  # as ws-mode serve's server does once started
    serve_inherited(
        app,
        args,
        ws=WS_IMPLEMENTATIONS[spec.get("ws", "batched")],
        backlog=BACKLOG,
        ws_max_size=64 * 1024 * 1024,
        timeout_keep_alive=60,
    )
    return 0


# ----------------------------------------------------------------------------- the chains
# Each distinct tool-call chain runs once over plain HTTP with the whole history
# (`reference_chains`): what every turn of the load must then give.


TOOL: Final = {
    "type": "function",
    "name": "lookup",
    "description": "Look a step of the task up.",
    "parameters": {
        "type": "object",
        "properties": {"step": {"type": "integer"}, "context_digest": {"type": "string"}},
    },
    "strict": False,
}
INSTRUCTIONS: Final = "Use the lookup tool until you know enough, then answer."


def tool_output(variant: int, step: int, size: int) -> str:
    """The client's answer to the model's `step`-th tool call in chain `variant`."""
    head = f"variant {variant} step {step}: "
    filler = "0123456789abcdef" * (size // 16 + 1)
    return (head + filler)[: max(size, len(head))]


def first_input(variant: int) -> list[dict[str, Any]]:
    """The user message that starts chain `variant`."""
    return [{"role": "user", "content": f"Task {variant}: plan the steps and look each one up."}]


@dataclass
class Chain:
    """The expected turns of one chain: each turn's new input and its output items."""

    inputs: list[list[dict[str, Any]]]
    outputs: list[list[dict[str, Any]]]
    cache_bytes: int


def reference_chains(base_url: str, options: LoadOptions) -> list[Chain]:
    """Run each distinct chain once over plain HTTP, with the whole history every turn."""
    from ws_mode.toolkit.http_client import (
        HttpClient,  # the clients' imports: see the module's docstring
    )

    chains: list[Chain] = []
    with HttpClient(base_url, timeout=60.0) as http:
        for variant in range(VARIANTS):
            history: list[dict[str, Any]] = []
            chain = Chain([], [], 0)
            new_input = first_input(variant)
            for step in range(options.turns):
                history.extend(new_input)
                body = {"model": "reference", "input": history, "tools": [TOOL]}
                body["instructions"] = INSTRUCTIONS
                response = http.post_json(SOCKET_PATH, body)
                output = response["output"]
                chain.inputs.append(new_input)
                chain.outputs.append(output)
                # What the cache counts for this turn (ws_mode._cache.CachedResponse.size).
                encoded = b",".join(orjson.dumps(item) for item in new_input)
                event = {"type": "response.completed", "sequence_number": 0, "response": response}
                chain.cache_bytes += len(encoded) + len(orjson.dumps(event)) + NODE_OVERHEAD
                history.extend(output)
                if step + 1 < options.turns:
                    call = output[0]
                    if call.get("type") != "function_call":
                        raise LoadError(f"the reference model answered early: {output}")
                    new_input = [
                        {
                            "type": "function_call_output",
                            "call_id": call["call_id"],
                            "output": tool_output(variant, step + 1, options.tool_output_bytes),
                        }
                    ]
            if chain.outputs[-1][0].get("type") != "message":
                raise LoadError("the reference model did not answer on the last turn")
            chains.append(chain)
    return chains


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


# ----------------------------------------------------------------------------- the report
# A SideReport adds up the rounds of one side; a LoadReport holds both sides, the memory bound
# the sockets' peak must stay under, the ratios WebSocket/HTTP, its text table and its JSON.


#: The figures compared WebSocket/HTTP: (name, SideReport attribute).
RATIOS: Final = (
    ("turns_per_second", "turns_per_second"),
    ("latency_p50", "latency_p50_ms"),
    ("latency_p99", "latency_p99_ms"),
    ("latency_max", "latency_max_ms"),
    ("server_cpu_per_turn", "server_cpu_ms_per_turn"),
    ("client_cpu_per_turn", "client_cpu_ms_per_turn"),
    ("server_rss_peak", "rss_peak"),
)


@dataclass
class SideReport:
    """One side of the load (``websocket`` or ``http``), over every round it ran.

    ``connections`` is what the clients opened (sockets, or HTTP keep-alive connections);
    ``server_connections`` what the server saw: the sockets open at once before the first turn
    (the fewest over the rounds), or the distinct HTTP connections that sent requests (the most
    over the rounds: one more than a conversation's means a connection was not kept alive).
    Connections, turns, seconds and CPU time add up over the rounds; ``rss_start`` (the
    server's RSS before the side connects, the previous side's memory released) and
    ``rss_peak`` are the highest over the rounds.
    """

    transport: str
    connections_expected: int = 0
    connections: int = 0
    server_connections: int = 0
    conversations: int = 0
    turns: int = 0
    turns_expected: int = 0
    seconds: float = 0.0
    turns_per_second: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    server_cpu_seconds: float = 0.0
    server_cpu_ms_per_turn: float = 0.0
    client_cpu_seconds: float = 0.0
    client_cpu_ms_per_turn: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0
    #: Each round's server RSS at the side's start and its peak: ``[start, peak]``.
    rss_rounds: list[list[int]] = field(default_factory=list)
    rounds: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """Every turn of every round ran and was right, every connection opened and was used
        as one conversation's (or one socket's), and nothing failed."""
        return (
            not self.errors
            and self.rounds > 0
            and self.turns == self.turns_expected
            and self.connections == self.connections_expected * self.rounds
            and self.server_connections == self.connections_expected
        )

    def finish(self) -> None:
        """Work the rates and percentiles out of the totals (after the last round)."""
        self.turns_per_second = self.turns / self.seconds if self.seconds else 0.0
        self.latency_p50_ms = percentile(self.latencies, 0.50) * 1000
        self.latency_p99_ms = percentile(self.latencies, 0.99) * 1000
        self.latency_max_ms = max(self.latencies, default=0.0) * 1000
        per_turn = 1000 / self.turns if self.turns else 0.0
        self.server_cpu_ms_per_turn = self.server_cpu_seconds * per_turn
        self.client_cpu_ms_per_turn = self.client_cpu_seconds * per_turn

    def summary(self) -> dict[str, Any]:
        """The report's fields, without the raw latencies."""
        fields = asdict(self)
        del fields["latencies"]
        return {**fields, "ok": self.ok}


@dataclass
class LoadReport:
    """What one load run measured: the socket side, the HTTP side (None with ``http=False``),
    the server's memory and counters."""

    options: dict[str, Any]
    websocket: SideReport = field(default_factory=lambda: SideReport("websocket"))
    http: SideReport | None = None
    server_pid: int = 0
    rss_at_rest: int = 0
    rss_after: int = 0
    rss_bound: int = 0
    rss_source: str = ""
    cache_bytes_expected: int = 0
    server_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Both sides ran every turn right, and the server stayed within its memory bound
        while the sockets ran."""
        return (
            self.websocket.ok
            and (self.http is None or self.http.ok)
            and 0 < self.websocket.rss_peak <= self.rss_bound
        )

    def ratios(self) -> dict[str, float]:
        """WebSocket/HTTP for each of :data:`RATIOS` (empty without an HTTP side; a figure
        HTTP measured as 0 is left out)."""
        if self.http is None:
            return {}
        return {
            name: getattr(self.websocket, attribute) / getattr(self.http, attribute)
            for name, attribute in RATIOS
            if getattr(self.http, attribute)
        }

    def to_json(self) -> str:
        """The report as JSON: both sides, the ratios, ``ok``."""
        fields = {
            name: value for name, value in asdict(self).items() if name not in ("websocket", "http")
        }
        document = {
            **fields,
            "websocket": self.websocket.summary(),
            "http": None if self.http is None else self.http.summary(),
            "ratios": self.ratios(),
            "ok": self.ok,
        }
        return json.dumps(document, indent=2, sort_keys=True)

    def text(self) -> str:
        """The report as a table, a column per side and one for WebSocket/HTTP."""
        sides = [self.websocket] if self.http is None else [self.websocket, self.http]
        ratios = self.ratios()
        rows: list[tuple[str, list[str], str]] = [
            ("rounds", [str(s.rounds) for s in sides], ""),
            ("connections", [f"{s.connections // max(1, s.rounds)} a round" for s in sides], ""),
            ("  server saw", [str(s.server_connections) for s in sides], ""),
            ("conversations", [str(s.conversations) for s in sides], ""),
            ("turns", [f"{s.turns} of {s.turns_expected}" for s in sides], ""),
            ("seconds", [f"{s.seconds:.2f}" for s in sides], ""),
        ]
        figures = (
            ("turns/s", "turns_per_second", "{:.0f}"),
            ("p50 turn ms", "latency_p50", "{:.1f}"),
            ("p99 turn ms", "latency_p99", "{:.1f}"),
            ("max turn ms", "latency_max", "{:.1f}"),
            ("server CPU/turn ms", "server_cpu_per_turn", "{:.2f}"),
            ("client CPU/turn ms", "client_cpu_per_turn", "{:.2f}"),
        )
        for label, name, shape in figures:
            attribute = dict(RATIOS)[name]
            rows.append((label, [shape.format(getattr(s, attribute)) for s in sides], name))
        rows.append(("server RSS by round", [_rounds(s.rss_rounds) for s in sides], ""))
        rows.append(
            ("server peak RSS", [format_bytes(s.rss_peak) for s in sides], "server_rss_peak")
        )
        rows.append(("errors", [_errors(s.errors) for s in sides], ""))
        header = ["", *(s.transport for s in sides), *(["WS/HTTP"] if self.http else [])]
        table = [header]
        for label, values, ratio in rows:
            extra = [f"{ratios[ratio]:.2f}x" if ratio in ratios else ""] if self.http else []
            table.append([label, *values, *extra])
        widths = [max(len(row[column]) for row in table) for column in range(len(header))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in table
        ]
        lines.append(
            f"server RSS at rest {format_bytes(self.rss_at_rest)}, after "
            f"{format_bytes(self.rss_after)}; the sockets' peak must stay under "
            f"{format_bytes(self.rss_bound)} ({self.rss_source}; the caches count "
            f"{format_bytes(self.cache_bytes_expected)})"
        )
        threshold = self.options.get("gc_threshold")
        lines.append(
            f"server: uvicorn --ws {self.options.get('ws')}, garbage collector "
            + (
                f"tuned (young collections every {threshold} allocations)"
                if threshold
                else "as Python sets it"
            )
        )
        stats = self.server_stats
        if stats:
            lines.append(
                f"middleware stats: socket turns {stats.get('turns')}, cache hits "
                f"{stats.get('cache_hits')}, misses {stats.get('cache_misses')}, evictions "
                f"{stats.get('cache_evictions')}, bytes saved {stats.get('bytes_saved')}, "
                f"errors {stats.get('errors')}"
            )
        for side in sides:
            lines.extend(f"  {side.transport} e.g. {sample}" for sample in side.error_samples[:5])
        lines.append("result: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def _rounds(rss: list[list[int]]) -> str:
    """Each round's RSS at start and peak, in MiB: ``52→290, 138→281 MiB``."""
    mib = 1024 * 1024
    return ", ".join(f"{start / mib:.0f}→{peak / mib:.0f}" for start, peak in rss) + " MiB"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{kind}: {count}" for kind, count in sorted(errors.items())) or "none"


# ----------------------------------------------------------------------------- the run


SERVER_START_SECONDS: Final = 30.0
#: Open files besides the clients' connections: the server's stats client, threads, logs.
SPARE_FILES: Final = 64
#: How the report names where the server's peak RSS came from.
RSS_SOURCES: Final = {"/proc": "/proc VmHWM", "getrusage": "getrusage", "psutil": "psutil samples"}


def check_file_limit(options: LoadOptions) -> None:
    """Raise the open-file limit as far as it goes (the server inherits it); :class:`LoadError`
    when it still cannot hold every connection of the larger side at once."""
    needed = (options.conversations if options.http else options.connections) + SPARE_FILES
    limit = raise_file_limit()
    if 0 <= limit < needed:
        raise LoadError(
            f"this run holds {needed} open files at once but the limit is {limit} "
            "(raise it with ulimit -n, or run fewer connections)"
        )


@contextlib.contextmanager
def server_process(options: LoadOptions) -> Iterator[ServerProcess]:
    """Run the load server in a subprocess; yield its origin and pid. It is killed on exit."""
    spec = {
        "turns": options.turns,
        "tokens_per_second": options.tokens_per_second,
        "full_context": options.full_context,
        "connections": options.connections,
        "max_cached_bytes": options.max_cached_bytes,
        "max_cached_responses": options.max_cached_responses,
        "ws": options.ws,
        "gc_threshold": options.gc_threshold,
    }
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                loopback_process(
                    "benchmarks.load",
                    ["--serve", "--spec", json.dumps(spec)],
                    ready_path=STATS_PATH,
                    lifetime=options.duration + 120.0,
                    backlog=BACKLOG,
                    start_timeout=SERVER_START_SECONDS,
                )
            )
        except ServerStartError as exc:
            raise LoadError(f"the load server did not start: {exc}") from exc
        yield server


async def run_load(options: LoadOptions, base_url: str, pid: int) -> LoadReport:
    """Run the load against a server already listening at `base_url` (process `pid`): each
    round runs the sockets then HTTP (HTTP first in odd rounds), one side after the other."""
    from ws_mode.toolkit.http_client import HttpClient

    check_file_limit(options)
    report = LoadReport(options=asdict(options), server_pid=pid)
    report.http = SideReport("http") if options.http else None
    deadline = time.monotonic() + options.duration
    with HttpClient(base_url, timeout=30.0) as http:
        probe = Probe(http)
        chains = await asyncio.to_thread(reference_chains, base_url, options)
        at_rest = await probe.state()
        report.rss_at_rest = at_rest["memory"]["rss"] or 0
        report.rss_source = RSS_SOURCES.get(at_rest["memory"]["source"], "unavailable")
        report.cache_bytes_expected = sum(
            min(
                options.max_cached_bytes,
                sum(
                    chains[options.variant_of(index, lane)].cache_bytes
                    for lane in range(options.lanes_of(index))
                ),
            )
            for index in range(options.connections)
        )
        load = Load(base_url, pid, options, chains, history_bodies(chains), deadline, probe)
        sides = [report.websocket] if report.http is None else [report.websocket, report.http]
        for number in range(options.rounds):
            for side in sides if number % 2 == 0 else sides[::-1]:
                await run_side(load, side)
        after = await probe.state()
    for side in sides:
        side.finish()
    report.rss_after = after["memory"]["rss"] or 0
    if at_rest["memory"]["source"] != "/proc" and report.websocket.rss_peak:
        report.rss_source = "psutil samples"
    report.server_stats = after["stats"]
    report.rss_bound = rss_bound(
        report.rss_at_rest, options.connections, report.cache_bytes_expected
    )
    return report


def run(options: LoadOptions) -> LoadReport:
    """Start the server subprocess, run the load, kill the server; the report."""
    check_file_limit(options)
    with server_process(options) as server:
        return asyncio.run(run_load(options, server.base_url, server.pid))


# ----------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.load`` (the load's side)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
        description="Load-test WebSocket mode: the reference server behind the middleware in a "
        "subprocess, hundreds of sockets running tool-call chains on loopback, then the same "
        "conversations over plain HTTP at the same concurrency.",
    )
    defaults = LoadOptions()
    parser.add_argument("--connections", type=int, default=defaults.connections)
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns per chain")
    parser.add_argument(
        "--lanes", type=int, default=defaults.lanes, help="most lanes per socket (1 to this)"
    )
    parser.add_argument("--tool-output-bytes", type=int, default=defaults.tool_output_bytes)
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        help="cap on the run once the server listens, in seconds (closing takes up to 2 s more)",
    )
    parser.add_argument(
        "--full-context", choices=("always", "on_miss"), default=defaults.full_context
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=defaults.tokens_per_second,
        help="the reference model's speed (0: no delay)",
    )
    parser.add_argument("--max-cached-bytes", type=int, default=defaults.max_cached_bytes)
    parser.add_argument("--connect-concurrency", type=int, default=defaults.connect_concurrency)
    parser.add_argument(
        "--no-http",
        dest="http",
        action="store_false",
        help="run the sockets only, not the same conversations over plain HTTP",
    )
    parser.add_argument(
        "--no-compression",
        dest="compression",
        action="store_false",
        help="sockets without permessage-deflate (the openai SDK asks for it)",
    )
    parser.add_argument(
        "--ws",
        choices=tuple(WS_IMPLEMENTATIONS),
        default=defaults.ws,
        help="the server's uvicorn WebSocket implementation, as ws-mode serve --ws "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=defaults.gc_threshold,
        metavar="N",
        help="the server's garbage collector as ws-mode serve sets it: young collections every "
        "N allocations, what is alive at start frozen (ws_mode.tune_gc); 0 leaves "
        "Python's collector as it is (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help="rounds of both sides, alternating which goes first (sockets in the first)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"longer histories: {LONG_TURNS} turns with {LONG_TOOL_OUTPUT_BYTES}-byte tool "
        "outputs, one lane per socket (overrides --turns, --tool-output-bytes and --lanes)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def options_from(arguments: argparse.Namespace) -> LoadOptions:
    """The load's options from the parsed command line (``--long`` sets the chains' shape)."""
    turns, tool_output_bytes, lanes = arguments.turns, arguments.tool_output_bytes, arguments.lanes
    if arguments.long:
        turns, tool_output_bytes, lanes = LONG_TURNS, LONG_TOOL_OUTPUT_BYTES, 1
    return LoadOptions(
        connections=arguments.connections,
        turns=turns,
        lanes=lanes,
        tool_output_bytes=tool_output_bytes,
        duration=arguments.duration,
        full_context=arguments.full_context,
        tokens_per_second=arguments.tokens_per_second,
        max_cached_bytes=arguments.max_cached_bytes,
        connect_concurrency=arguments.connect_concurrency,
        http=arguments.http,
        rounds=arguments.rounds,
        compression=arguments.compression,
        ws=arguments.ws,
        gc_threshold=arguments.gc_threshold,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.load``: run the load, print the report; 0 when it is OK.
    With ``--serve``, be the load server's process instead (:func:`serve`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve" in argv:
        return serve(argv)
    arguments = build_parser().parse_args(argv)
    try:
        report = run(options_from(arguments))
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if arguments.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
