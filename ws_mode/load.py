"""A load test of WebSocket mode: hundreds of sockets running tool-call chains at once.

``python -m ws_mode.load --connections 300 --turns 5 --lanes 4`` starts the reference server
(:mod:`ws_mode.reference`) behind :class:`~ws_mode.WebSocketModeMiddleware` under uvicorn in a
subprocess on loopback, then opens ``--connections`` sockets (the asyncio ``websockets``
client), all of them before any turn starts. Each socket runs one tool-call chain of
``--turns`` turns on each of its lanes (1 to ``--lanes``, the default lane and named ones,
concurrently): a user message, then ``turns - 1`` times the model asks for a tool and the client
answers with a ``--tool-output-bytes`` output, the last turn is the model's final answer.

Every turn is checked: its output must be exactly what the reference model gives for that
context over plain HTTP (the model is deterministic per context; each distinct chain is run
once over HTTP with the whole history first), its events must carry its lane's ``stream_id``,
and no error may arrive. The report gives connections, turns, turns/s, p50/p99 turn latency
(create sent to terminal event received), errors, the middleware's counters
(``middleware.stats``) and the server's RSS: at rest before the load and at its peak (VmHWM
from ``/proc``, or sampled with psutil when ``/proc`` is missing). The peak must stay under a
bound derived from the cache limits (:func:`rss_bound`): the run fails when it does not.

Loopback only, bounded in count and time (``--duration`` caps the whole run); the server
subprocess is always killed, and kills itself if this process dies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import orjson

__all__ = [
    "LoadError",
    "LoadOptions",
    "LoadReport",
    "main",
    "rss_bound",
    "run",
    "run_load",
]

HOST: Final = "127.0.0.1"
READY_PREFIX: Final = "listening on "
STATS_PATH: Final = "/load/stats"
SOCKET_PATH: Final = "/v1/responses"
SERVER_START_SECONDS: Final = 30.0
#: Chains differ by their first user message; this many distinct ones are run (and checked
#: over HTTP once each).
VARIANTS: Final = 8
TERMINAL: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "error"}
)
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

# Bounds of the command line: a load test, not a denial of service.
MAX_CONNECTIONS: Final = 2000
MAX_TURNS: Final = 200
MAX_LANES: Final = 16
MAX_TOOL_OUTPUT_BYTES: Final = 1024 * 1024
MAX_DURATION: Final = 3600.0

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
#: What each cached response counts on top of its encoded items (`ws_mode.cache`).
NODE_OVERHEAD: Final = 512


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

    def variant_of(self, connection: int, lane: int) -> int:
        return (connection * self.lanes + lane) % VARIANTS


@dataclass
class LoadReport:
    """What one load run measured."""

    options: dict[str, Any]
    connections: int = 0
    connections_open_peak: int = 0
    lanes: int = 0
    turns: int = 0
    turns_expected: int = 0
    seconds: float = 0.0
    turns_per_second: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    server_pid: int = 0
    rss_at_rest: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    rss_bound: int = 0
    rss_source: str = ""
    cache_bytes_expected: int = 0
    server_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every turn ran, was right, and the server stayed within its memory bound."""
        return (
            not self.errors
            and self.turns == self.turns_expected
            and self.connections_open_peak == self.options["connections"]
            and 0 < self.rss_peak <= self.rss_bound
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2, sort_keys=True)

    def text(self) -> str:
        mib = 1024 * 1024
        lines = [
            f"connections      {self.connections} opened, {self.connections_open_peak} open at "
            f"once, {self.lanes} lanes",
            f"turns            {self.turns} of {self.turns_expected} in {self.seconds:.2f} s "
            f"= {self.turns_per_second:.0f} turns/s",
            f"turn latency     p50 {self.latency_p50_ms:.1f} ms, p99 {self.latency_p99_ms:.1f} ms,"
            f" max {self.latency_max_ms:.1f} ms",
            "errors           "
            + (", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())) or "none"),
            f"server RSS       {self.rss_at_rest / mib:.1f} MiB at rest, peak "
            f"{self.rss_peak / mib:.1f} MiB (bound {self.rss_bound / mib:.1f} MiB, "
            f"{self.rss_source}), {self.rss_after / mib:.1f} MiB after",
            f"cache (expected) {self.cache_bytes_expected / mib:.1f} MiB counted by the caches",
        ]
        stats = self.server_stats
        if stats:
            lines.append(
                f"server stats     turns {stats.get('turns')}, cache hits "
                f"{stats.get('cache_hits')}, misses {stats.get('cache_misses')}, evictions "
                f"{stats.get('cache_evictions')}, bytes saved {stats.get('bytes_saved')}, "
                f"errors {stats.get('errors')}"
            )
        lines.extend(f"  e.g. {sample}" for sample in self.error_samples[:5])
        lines.append("result           " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


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


def _serve(spec: dict[str, Any]) -> None:
    """The server subprocess: the reference app behind the middleware, under uvicorn."""
    import uvicorn
    from starlette.types import Receive, Scope, Send

    from .limits import Limits
    from .middleware import WebSocketModeMiddleware
    from .reference import ReferenceConfig, create_app, render_items

    _watch_parent(float(spec["lifetime"]))
    _raise_file_limit()
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

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            stats = getattr(middleware, "stats", None)
            body = orjson.dumps(
                {
                    "pid": os.getpid(),
                    "connections": middleware.connections,
                    "memory": _memory(os.getpid()),
                    "stats": stats.snapshot() if stats is not None else {},
                }
            )
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await middleware(scope, receive, send)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    listener.listen(4096)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            backlog=4096,
            ws_max_size=64 * 1024 * 1024,
            timeout_keep_alive=60,
        )
    )
    print(f"{READY_PREFIX}http://{HOST}:{listener.getsockname()[1]}", flush=True)
    server.run(sockets=[listener])


def _watch_parent(lifetime: float) -> None:
    """End this process when its parent is gone, or after `lifetime` seconds whatever happens."""
    parent = os.getppid()
    deadline = time.monotonic() + lifetime

    def watch() -> None:
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _raise_file_limit() -> None:
    """Allow as many open files as the hard limit does (each socket is one)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _memory(pid: int) -> dict[str, Any]:
    """RSS and peak RSS (VmHWM) of process `pid`, in bytes, with where they came from."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        text = ""
    found = {
        name: int(match.group(1)) * 1024
        for name in ("VmRSS", "VmHWM")
        if (match := re.search(rf"^{name}:\s+(\d+)\s+kB", text, re.MULTILINE))
    }
    if "VmRSS" in found and "VmHWM" in found:
        return {"rss": found["VmRSS"], "peak": found["VmHWM"], "source": "/proc VmHWM"}
    try:
        psutil: Any = importlib.import_module("psutil")
    except ImportError:
        return {"rss": 0, "peak": 0, "source": "unavailable"}
    rss = int(psutil.Process(pid).memory_info().rss)
    return {"rss": rss, "peak": 0, "source": "psutil samples"}


@contextlib.contextmanager
def server_process(options: LoadOptions) -> Iterator[tuple[str, int]]:
    """Run the load server in a subprocess; yield its origin and pid. It is killed on exit."""
    spec = {
        "turns": options.turns,
        "tokens_per_second": options.tokens_per_second,
        "full_context": options.full_context,
        "connections": options.connections,
        "max_cached_bytes": options.max_cached_bytes,
        "max_cached_responses": options.max_cached_responses,
        "lifetime": options.duration + 120.0,
    }
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the finally below)
    process = subprocess.Popen(
        [sys.executable, "-m", "ws_mode.load", "--serve", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=str(Path(__file__).resolve().parent.parent),
        start_new_session=True,
    )
    try:
        yield _wait_ready(process, stderr), process.pid
    finally:
        _kill(process)
        stderr.close()


def _wait_ready(process: subprocess.Popen[bytes], stderr: IO[bytes]) -> str:
    assert process.stdout is not None
    line = b""
    deadline = time.monotonic() + SERVER_START_SECONDS
    os.set_blocking(process.stdout.fileno(), False)
    while b"\n" not in line and time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
            continue
        time.sleep(0.02)
    text = line.decode(errors="replace").partition("\n")[0].strip()
    if not text.startswith(READY_PREFIX):
        stderr.seek(0)
        detail = stderr.read().decode(errors="replace").strip().splitlines()[-8:]
        raise LoadError("the load server did not start: " + (" | ".join(detail) or text))
    return text.removeprefix(READY_PREFIX)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
    if process.stdout is not None:
        process.stdout.close()


# ----------------------------------------------------------------------------- the chains


def tool_output(variant: int, step: int, size: int) -> str:
    """The client's answer to the model's `step`-th tool call in chain `variant`."""
    head = f"variant {variant} step {step}: "
    filler = "0123456789abcdef" * (size // 16 + 1)
    return (head + filler)[: max(size, len(head))]


def first_input(variant: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Task {variant}: plan the steps and look each one up."}]


@dataclass
class Chain:
    """The expected turns of one chain: each turn's new input and its output items."""

    inputs: list[list[dict[str, Any]]]
    outputs: list[list[dict[str, Any]]]
    cache_bytes: int


async def reference_chains(base_url: str, options: LoadOptions) -> list[Chain]:
    """Run each distinct chain once over plain HTTP, with the whole history every turn."""
    import httpx

    chains: list[Chain] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as http:
        for variant in range(VARIANTS):
            history: list[dict[str, Any]] = []
            chain = Chain([], [], 0)
            new_input = first_input(variant)
            for step in range(options.turns):
                history.extend(new_input)
                body = {"model": "reference", "input": history, "tools": [TOOL]}
                body["instructions"] = INSTRUCTIONS
                answer = await http.post(SOCKET_PATH, json=body)
                answer.raise_for_status()
                response = answer.json()
                output = response["output"]
                chain.inputs.append(new_input)
                chain.outputs.append(output)
                # What the cache counts for this turn (ws_mode.cache.CachedResponse.size).
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


# ----------------------------------------------------------------------------- the clients


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

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {detail[:300]}")


#: Handed to each lane's queue when its socket is gone.
CLOSED: Final[dict[str, Any]] = {"type": "socket.closed"}


class _Socket:
    """One client socket: a reader task hands each lane the events of its stream_id."""

    def __init__(self, ws: Any, lanes: list[str | None], tally: Tally, tag: str) -> None:
        self.ws = ws
        self.queues: dict[str | None, asyncio.Queue[dict[str, Any]]] = {
            lane: asyncio.Queue() for lane in lanes
        }
        self.tally = tally
        self.tag = tag

    async def read(self) -> None:
        try:
            async for frame in self.ws:
                if not isinstance(frame, str):
                    self.tally.error("binary_frame", self.tag)
                    continue
                try:
                    event = orjson.loads(frame)
                except orjson.JSONDecodeError:
                    self.tally.error("not_json", f"{self.tag}: {frame[:200]}")
                    continue
                queue = self.queues.get(event.get("stream_id"))
                if queue is None:
                    self.tally.error("unknown_stream_id", f"{self.tag}: {frame[:200]}")
                    continue
                queue.put_nowait(event)
        except Exception as exc:  # the connection failed: each waiting lane hears it below
            self.tally.error(f"socket:{type(exc).__name__}", f"{self.tag}: {exc}")
        finally:
            # The socket is gone: a lane still waiting for its turn's end learns it at once.
            for queue in self.queues.values():
                queue.put_nowait(CLOSED)


async def _lane(
    sock: _Socket, lane: str | None, chain: Chain, options: LoadOptions, tally: Tally
) -> None:
    where = f"{sock.tag} lane {lane}"
    queue = sock.queues[lane]
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
        await sock.ws.send(orjson.dumps(create).decode())
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), options.turn_timeout)
            except TimeoutError:
                tally.error("turn_timeout", f"{where} turn {step + 1}")
                return
            if event is CLOSED:
                tally.error("socket_closed", f"{where} turn {step + 1}")
                return
            if event["type"] in TERMINAL:
                break
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


async def _client(
    index: int,
    url: str,
    options: LoadOptions,
    chains: list[Chain],
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
) -> None:
    from websockets.asyncio.client import connect

    count = options.lanes_of(index)
    lanes: list[str | None] = [None, *(f"lane-{lane}" for lane in range(1, count))]
    tag = f"connection {index}"
    try:
        async with gate:
            ws = await connect(url, max_size=None, open_timeout=60, close_timeout=2, proxy=None)
    except Exception as exc:
        tally.error(f"connect:{type(exc).__name__}", f"{tag}: {exc}")
        return
    finally:
        tally.settled += 1
        if tally.settled == tally.expected:
            tally.all_settled.set()
    if tally.stopped:
        with contextlib.suppress(Exception):
            await ws.close()
        return
    tally.connected += 1
    sock = _Socket(ws, lanes, tally, tag)
    reader = asyncio.create_task(sock.read())
    try:
        await start.wait()
        tally.lanes += len(lanes)
        await asyncio.gather(
            *(
                _lane(sock, lane, chains[options.variant_of(index, number)], options, tally)
                for number, lane in enumerate(lanes)
            )
        )
    except Exception as exc:
        tally.error(f"client:{type(exc).__name__}", f"{tag}: {exc}")
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        with contextlib.suppress(Exception):
            await ws.close()


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return cuts[min(len(cuts) - 1, max(0, round(fraction * 1000) - 1))]


async def run_load(options: LoadOptions, base_url: str, pid: int) -> LoadReport:
    """Run the load against a server already listening at `base_url` (process `pid`)."""
    import httpx

    _raise_file_limit()
    report = LoadReport(options=asdict(options), server_pid=pid)
    deadline = time.monotonic() + options.duration
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http:

        async def server_state() -> dict[str, Any]:
            answer = await http.get(STATS_PATH)
            answer.raise_for_status()
            state: dict[str, Any] = answer.json()
            return state

        chains = await reference_chains(base_url, options)
        at_rest = await server_state()
        report.rss_at_rest = at_rest["memory"]["rss"]
        report.rss_source = at_rest["memory"]["source"]
        sampler = _PeakSampler(pid)
        sampler.start()

        tally = Tally(expected=options.connections)
        gate = asyncio.Semaphore(options.connect_concurrency)
        start = asyncio.Event()
        url = base_url.replace("http://", "ws://", 1) + SOCKET_PATH
        clients = [
            asyncio.create_task(_client(index, url, options, chains, tally, gate, start))
            for index in range(options.connections)
        ]
        report.turns_expected = options.turns * sum(
            options.lanes_of(index) for index in range(options.connections)
        )
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
        try:
            # Every socket is open before the first turn starts.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    await tally.all_settled.wait()
            report.connections_open_peak = (await server_state())["connections"]
            report.connections = tally.connected
            began = time.perf_counter()
            start.set()
            left = max(0.1, deadline - time.monotonic())
            _done, pending = await asyncio.wait(clients, timeout=left)
            report.seconds = time.perf_counter() - began
            if pending:
                tally.error("duration", f"{len(pending)} connections still running at the cap")
        finally:
            tally.stopped = True
            for client in clients:
                client.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            sampler.stop()
        after = await server_state()
        for _ in range(100):  # the server closes the sockets soon after the clients did
            if after["connections"] == 0:
                break
            await asyncio.sleep(0.05)
            after = await server_state()
    report.turns = tally.turns
    report.lanes = tally.lanes
    report.errors = dict(tally.errors)
    report.error_samples = tally.samples
    report.turns_per_second = report.turns / report.seconds if report.seconds else 0.0
    report.latency_p50_ms = _percentile(tally.latencies, 0.50) * 1000
    report.latency_p99_ms = _percentile(tally.latencies, 0.99) * 1000
    report.latency_max_ms = max(tally.latencies, default=0.0) * 1000
    report.rss_peak = max(after["memory"]["peak"], sampler.peak)
    report.rss_after = after["memory"]["rss"]
    if report.rss_source == "psutil samples" or not after["memory"]["peak"]:
        report.rss_source = "psutil samples" if sampler.peak else report.rss_source
    report.server_stats = after["stats"]
    report.rss_bound = rss_bound(
        report.rss_at_rest, report.connections, report.cache_bytes_expected
    )
    if after["connections"] != 0:
        report.errors["connections_left_open"] = after["connections"]
    return report


class _PeakSampler:
    """Samples the server's RSS with psutil, when it is installed, for systems without
    /proc's VmHWM; a no-op otherwise."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if Path(f"/proc/{self.pid}/status").exists():
            return  # VmHWM is exact
        try:
            psutil: Any = importlib.import_module("psutil")
        except ImportError:
            return
        process = psutil.Process(self.pid)

        def sample() -> None:
            while not self._stop.wait(0.05):
                with contextlib.suppress(Exception):
                    self.peak = max(self.peak, int(process.memory_info().rss))

        self._thread = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)


def run(options: LoadOptions) -> LoadReport:
    """Start the server subprocess, run the load, kill the server; the report."""
    with server_process(options) as (base_url, pid):
        return asyncio.run(run_load(options, base_url, pid))


# ----------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ws_mode.load",
        description="Load-test WebSocket mode: the reference server behind the middleware in a "
        "subprocess, hundreds of sockets running tool-call chains on loopback.",
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
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.serve is not None:
        _serve(json.loads(arguments.serve))
        return 0
    try:
        options = LoadOptions(
            connections=arguments.connections,
            turns=arguments.turns,
            lanes=arguments.lanes,
            tool_output_bytes=arguments.tool_output_bytes,
            duration=arguments.duration,
            full_context=arguments.full_context,
            tokens_per_second=arguments.tokens_per_second,
            max_cached_bytes=arguments.max_cached_bytes,
            connect_concurrency=arguments.connect_concurrency,
        )
        report = run(options)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if arguments.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
