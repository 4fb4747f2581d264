"""The store benchmark: what the Redis store costs WebSocket mode, per turn, per hydration and in
throughput.

``python -m benchmarks.store --redis redis://127.0.0.1:6379/0`` starts the bench server
in a subprocess on loopback: this same module, run as ``python -m benchmarks.store
--serve --redis URL --prefix P --fd N`` through :func:`ws_mode.testing._loopback.server_process`,
which binds the loopback socket and passes it down (:func:`build_store_app`, :func:`serve`). It
serves the reference server behind two middlewares: one without a store at
``/off/v1/responses``, one with a :class:`~ws_mode.redis_store.RedisStore` on ``--redis`` (keys
under a prefix of their own, deleted at the end) at ``/on/v1/responses``, both cache-aware
(``--full-context on_miss``, the reference's renderer: the cheapest turns, where the store's share
is largest) or both drop-in (``always``); plain HTTP ``POST /v1/responses`` goes through both to
the reference app; ``GET /bench/stats`` answers both middlewares' counters and the process's CPU
time. Interleaved in one run, it measures:

- **per turn**: a tool-call rollout (:func:`ws_mode.toolkit.rollout.run_socket`) at zero model
  cost, with the store and without, order alternated each repetition: each turn's wall time
  (send to terminal event), the rollout's, and the server's CPU per turn;
- **hydration**: one turn continuing a ``--chain-turns`` conversation, on a new socket (its
  chain hydrated from Redis) and on the connection that holds it in its cache; both must give
  the same output;
- **throughput**: ``--sockets`` sockets open at once, each running ``--socket-turns`` turns
  concurrently, with the store and without: turns per second.

:class:`StoreBenchOptions` says what to measure; :class:`StoreBenchReport` holds what was
measured, the ratios (:meth:`StoreBenchReport.ratios`) and the store's counters against what the
run expects of them, and prints as text or JSON: measurements and ratios only (the project's goals
for them are in benchmarks/NOTEBOOK.md). Needs the ``cli`` and ``redis`` extras.

``--encryption`` measures instead what encrypting the records at rest costs per stored turn
(:func:`measure_encryption`, needs the ``encryption`` extra): in this process, two
``RedisStore`` on the same Redis, one with an encryption key and one without, each writing a
``--turns`` conversation record by record (each ``put`` awaited, as a stored turn's write) and
then hydrating it (``get_ancestors`` of its last response), the order alternated each
repetition: per stored turn, the write's and the hydration's wall time, the process's CPU time
(the record's encoding and encryption, redis-py's work), and the bytes Redis keeps; the ratios
encrypted/plain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import httpx
import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.exceptions import InvalidHandshake

from ws_mode import FullContext, StoredResponse
from ws_mode.testing._client import AsyncSocket, SyncSocket, connect, connect_async
from ws_mode.testing._loopback import (
    ServerStartError,
    add_child_arguments,
    serve_inherited,
    server_process,
    ws_max_size,
)
from ws_mode.toolkit.agent import (
    DEFAULT_INSTRUCTIONS,
    DEFAULT_PROMPT,
    DEFAULT_TOOLS,
    RolloutError,
    request_fields,
    terminal_response,
    tool_output,
    user_message,
)
from ws_mode.toolkit.http_client import HttpClient, HttpStatusError
from ws_mode.toolkit.measure import format_bytes, format_seconds, median
from ws_mode.toolkit.reference.request import OVERRIDE_KEY
from ws_mode.toolkit.rollout import run_socket

from .load.server import raise_file_limit

__all__ = [
    "API_PATH",
    "BACKLOG",
    "PATHS",
    "STATS_PATH",
    "EncryptionReport",
    "StoreBenchError",
    "StoreBenchOptions",
    "StoreBenchReport",
    "build_store_app",
    "main",
    "measure_encryption",
    "run",
    "serve",
]


# ----------------------------------------------------------------------------- the options


MIDDLEWARES: Final = {
    "always": "drop-in (full_context=always)",
    "on_miss": "cache-aware (full_context=on_miss, the reference's renderer)",
}


class StoreBenchError(Exception):
    """The run could not measure: the server did not start, a turn failed, answers differed."""


@dataclass(frozen=True)
class StoreBenchOptions:
    """What to measure (see the module's docstring)."""

    redis_url: str
    turns: int = 25
    tool_output_bytes: int = 4096
    repeat: int = 5
    chain_turns: int = 50
    sockets: int = 200
    socket_turns: int = 5
    full_context: str = "on_miss"
    store_timeout: float = 2.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("turns", "repeat", "chain_turns", "sockets", "socket_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.store_timeout <= 0:
            raise ValueError("store_timeout must be > 0")
        if self.full_context not in ("always", "on_miss"):
            raise ValueError(f"full_context must be always or on_miss, got {self.full_context!r}")
        if self.turns < 2:
            raise ValueError("turns must be >= 2 (a rollout continues a response)")


# ----------------------------------------------------------------------------- the server


API_PATH: Final = "/v1/responses"
#: The socket path of each mode: without a store, with the Redis store.
PATHS: Final = {"off": "/off/v1/responses", "on": "/on/v1/responses"}
STATS_PATH: Final = "/bench/stats"
#: The bench's records live this long in Redis if the run could not delete them.
TTL_SECONDS: Final = 3600.0
#: The listening socket's backlog: every socket of the throughput run connects at once.
BACKLOG: Final = 4096


def build_store_app(
    redis_url: str,
    prefix: str,
    full_context: FullContext = "on_miss",
    timeout: float = 1.0,
) -> ASGIApp:
    """The reference app behind a middleware without a store and one with a RedisStore on
    ``redis_url`` (keys under ``prefix``, each call bounded by ``timeout``), both drop-in
    (``always``) or both cache-aware (``on_miss``, with the reference's renderer), and the
    stats route."""
    from ws_mode._middleware import WebSocketModeMiddleware
    from ws_mode.redis_store import RedisStore
    from ws_mode.toolkit.reference import ReferenceConfig, create_app, render_items

    # The tool calls come with each request (the reference's metadata override).
    reference = create_app(ReferenceConfig(tool_calls=0), path=API_PATH)
    store = RedisStore(redis_url, prefix=prefix, ttl_seconds=TTL_SECONDS, timeout=timeout)
    shared: dict[str, Any] = {"handler_path": API_PATH, "full_context": full_context}
    if full_context == "on_miss":
        shared["renderer"] = render_items
    # One tenant (the bench): the store's cost does not depend on whose scope a record is in.
    on = WebSocketModeMiddleware(
        reference, path=PATHS["on"], store=store, shared_store=True, **shared
    )
    off = WebSocketModeMiddleware(on, path=PATHS["off"], **shared)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            stats = {"on": on.stats.snapshot(), "off": off.stats.snapshot()}
            body = orjson.dumps({**stats, "cpu_seconds": time.process_time()})
            answer = Response(body, media_type="application/json")
            await answer(scope, receive, send)
            return
        await off(scope, receive, send)

    return app


def serve(argv: Sequence[str]) -> int:
    """The bench server's process: ``python -m benchmarks.store --serve --redis URL
    --prefix P --fd N`` (started by :func:`run`) serves :func:`build_store_app` on the parent's
    socket."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store --serve")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--redis", required=True, help="the Redis URL of the store")
    parser.add_argument("--prefix", required=True, help="the store's key prefix")
    parser.add_argument("--full-context", choices=("always", "on_miss"), default="on_miss")
    parser.add_argument("--store-timeout", type=float, default=2.0, help="RedisStore(timeout=)")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    # Warm what the first request would otherwise pay for: the tokenizer's training.
    from ws_mode.toolkit.reference import render_items

    render_items([{"role": "user", "content": "warm up"}])
    serve_inherited(
        build_store_app(args.redis, args.prefix, args.full_context, args.store_timeout),
        args,
        access_log=False,
        ws_max_size=ws_max_size(),
        backlog=BACKLOG,
        timeout_graceful_shutdown=2,
    )
    return 0


# ----------------------------------------------------------------------------- the clients


class _Counters:
    """The server's counters, read over HTTP, and what the run expects of the store's."""

    def __init__(self, http: HttpClient) -> None:
        self.http = http
        self.written = 0  # responses the store should have written by now
        self.hydrations = 0  # new sockets that continued a stored conversation

    def wait_writes(self, timeout: float = 30.0) -> dict[str, Any]:
        """The server's counters once its background writes have caught up (or failed)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.http.get_json(STATS_PATH)
            store = stats["on"]
            done = store["store_writes"] + store["store_failures"] >= self.written
            if done or time.monotonic() > deadline:
                return stats
            time.sleep(0.005)


def _order(repetition: int, modes: tuple[str, str] = ("off", "on")) -> tuple[str, str]:
    """The modes in the order a repetition runs them: alternated."""
    return modes if repetition % 2 == 0 else (modes[1], modes[0])


def _fields(tool_calls: int) -> dict[str, Any]:
    """What every turn sends: the model asks for a tool `tool_calls` times, then answers."""
    return request_fields(
        "reference", DEFAULT_TOOLS, DEFAULT_INSTRUCTIONS, {OVERRIDE_KEY: str(tool_calls)}
    )


def _response(event: dict[str, Any], turn: int) -> dict[str, Any]:
    try:
        return terminal_response(event, turn)
    except RolloutError as exc:
        raise StoreBenchError(str(exc)) from None


def _next(fields: dict[str, Any], response: dict[str, Any], size: int) -> dict[str, Any]:
    """The turn continuing `response`: the outputs of the tools it asked for."""
    outputs = [
        {"type": "function_call_output", "call_id": item["call_id"],
         "output": tool_output(item["call_id"], size)}
        for item in response["output"] if item["type"] == "function_call"
    ]  # fmt: skip
    return {"type": "response.create", **fields, "previous_response_id": response["id"],
            "input": outputs or [user_message("Go on.")]}  # fmt: skip


def _timed_turn(
    sock: SyncSocket, message: dict[str, Any], timeout: float
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    sock.send(message)
    events = sock.receive_turn(timeout=timeout)
    return time.perf_counter() - started, _response(events[-1], 0)


def measure_turns(
    base_url: str, options: StoreBenchOptions, counters: _Counters, report: StoreBenchReport
) -> None:
    """Per turn: tool-call rollouts with the store and without, interleaved."""
    turns: dict[str, list[float]] = {"off": [], "on": []}
    totals: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    answers: set[str] = set()
    for repetition in range(-1, options.repeat):  # -1: a warm-up per mode
        for mode in _order(repetition):
            before = counters.http.get_json(STATS_PATH)["cpu_seconds"]
            try:
                result = run_socket(
                    base_url, path=PATHS[mode], turns=options.turns, timeout=options.timeout,
                    tool_output_bytes=options.tool_output_bytes,
                    metadata={OVERRIDE_KEY: str(options.turns - 1)},
                )  # fmt: skip
            except RolloutError as exc:
                raise StoreBenchError(f"a rollout ({mode}) failed: {exc}") from exc
            if mode == "on":
                counters.written += result.turns
            after = counters.wait_writes()["cpu_seconds"]
            answers.add(result.answer)
            if repetition >= 0:
                turns[mode] += result.turn_seconds
                totals[mode].append(result.total_seconds)
                cpu[mode].append((after - before) / result.turns)
    if len(answers) != 1:
        raise StoreBenchError(f"the rollouts answered differently: {sorted(answers)}")
    report.turn = {mode: median(values) for mode, values in turns.items()}
    report.rollout = {mode: median(values) for mode, values in totals.items()}
    report.cpu_per_turn = {mode: median(values) for mode, values in cpu.items()}


def measure_hydration(
    base_url: str, options: StoreBenchOptions, counters: _Counters, report: StoreBenchReport
) -> None:
    """One turn continuing a long conversation, on the connection that holds it in its cache
    and on a new socket that hydrates it from the store, interleaved."""
    fields = _fields(options.chain_turns + 2 * options.repeat + 10)  # tool calls throughout
    size, timeout = options.tool_output_bytes, options.timeout
    message = {"type": "response.create", **fields, "input": [user_message(DEFAULT_PROMPT)]}
    times: dict[str, list[float]] = {"held": [], "new": []}
    outputs: set[bytes] = set()
    with connect(base_url, PATHS["on"], open_timeout=timeout) as held:
        for _ in range(options.chain_turns):
            message = _next(fields, _timed_turn(held, message, timeout)[1], size)
        counters.written += options.chain_turns
        counters.wait_writes()
        for repetition in range(-1, options.repeat):  # -1: a warm-up of each
            for where in _order(repetition, ("held", "new")):
                if where == "held":
                    seconds, response = _timed_turn(held, message, timeout)
                else:
                    with connect(base_url, PATHS["on"], open_timeout=timeout) as new:
                        seconds, response = _timed_turn(new, message, timeout)
                    counters.hydrations += 1
                counters.written += 1
                outputs.add(json.dumps(response["output"], sort_keys=True).encode())
                if repetition >= 0:
                    times[where].append(seconds)
    if len(outputs) != 1:
        raise StoreBenchError("a hydrated turn answered differently from the cached one")
    report.cached_turn, report.hydrated_turn = median(times["held"]), median(times["new"])


async def _chain(sock: AsyncSocket, index: int, options: StoreBenchOptions) -> int:
    fields = _fields(options.socket_turns)
    message = {"type": "response.create", **fields, "input": [user_message(f"Task {index}")]}
    for turn in range(1, options.socket_turns + 1):
        await sock.send(message)
        async with asyncio.timeout(options.timeout):
            events = await sock.receive_turn()
        message = _next(fields, _response(events[-1], turn), options.tool_output_bytes)
    return options.socket_turns


async def _concurrent(base_url: str, path: str, options: StoreBenchOptions) -> tuple[int, float]:
    """Every socket opened, then all their chains run at once: (turns, seconds)."""
    gate = asyncio.Semaphore(50)

    async def open_one() -> AsyncSocket:
        async with gate:
            return await connect_async(base_url, path, open_timeout=options.timeout)

    opened = await asyncio.gather(
        *(open_one() for _ in range(options.sockets)), return_exceptions=True
    )
    sockets = [sock for sock in opened if isinstance(sock, AsyncSocket)]
    try:
        if len(sockets) < options.sockets:
            failure = next(sock for sock in opened if not isinstance(sock, AsyncSocket))
            raise StoreBenchError(f"could not open {options.sockets} sockets: {failure!r}")
        started = time.perf_counter()
        counts = await asyncio.gather(*(_chain(s, i, options) for i, s in enumerate(sockets)))
        return sum(counts), time.perf_counter() - started
    finally:
        await asyncio.gather(*(sock.close() for sock in sockets), return_exceptions=True)


def measure_throughput(
    base_url: str, options: StoreBenchOptions, counters: _Counters, report: StoreBenchReport
) -> None:
    """Turns per second of many sockets at once, with the store and without, interleaved."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    report.concurrent_turns = {"off": 0, "on": 0}
    for repetition in range(options.repeat):
        for mode in _order(repetition):
            turns, seconds = asyncio.run(_concurrent(base_url, PATHS[mode], options))
            rates[mode].append(turns / seconds)
            report.concurrent_turns[mode] += turns
            if mode == "on":
                counters.written += turns
            counters.wait_writes()  # the next run starts with no writes in flight
    report.turns_per_second = {mode: median(values) for mode, values in rates.items()}


# ----------------------------------------------------------------------------- the report


@dataclass
class StoreBenchReport:
    """What one run measured (times in seconds), and the store's counters."""

    options: dict[str, Any]
    prefix: str = ""  # the run's Redis keys' prefix
    turn: dict[str, float] = field(default_factory=dict)  # per mode: median turn
    rollout: dict[str, float] = field(default_factory=dict)  # per mode: median rollout
    cpu_per_turn: dict[str, float] = field(default_factory=dict)  # per mode: server CPU
    cached_turn: float = 0.0
    hydrated_turn: float = 0.0
    turns_per_second: dict[str, float] = field(default_factory=dict)  # per mode
    concurrent_turns: dict[str, int] = field(default_factory=dict)  # per mode, every run
    store: dict[str, int] = field(default_factory=dict)  # the store's counters
    expected: dict[str, int] = field(default_factory=dict)  # what they should be
    store_off: dict[str, int] = field(default_factory=dict)  # the storeless side's: zeros

    @property
    def ok(self) -> bool:
        """Whether the store did what the run expects, and nothing without one. A write may
        land more than once: one that overtook its parent's write past the wait for it has
        the whole conversation written again (the same records: no harm, a little work)."""
        store, expected = self.store, self.expected
        return (
            store.get("store_writes", 0) >= expected["store_writes"]
            and all(
                store.get(name, 0) == expected[name] for name in expected if name != "store_writes"
            )
            and not any(self.store_off.values())
        )

    def ratios(self) -> dict[str, float]:
        """With the store / without it (per turn, rollout, CPU, turns/s), and a hydrated turn
        / the same turn from the cache."""

        def ratio(values: dict[str, float]) -> float:
            return values["on"] / values["off"] if values.get("off") else 0.0

        return {
            "turn": ratio(self.turn),
            "rollout": ratio(self.rollout),
            "cpu_per_turn": ratio(self.cpu_per_turn),
            "turns_per_second": ratio(self.turns_per_second),
            "hydration": self.hydrated_turn / self.cached_turn if self.cached_turn else 0.0,
        }

    def to_json(self) -> str:
        """The report as JSON, the ratios included."""
        return json.dumps({**asdict(self), "ratios": self.ratios()}, indent=2)

    def text(self) -> str:
        """The report as the command prints it."""
        o, r, ms = self.options, self.ratios(), format_seconds
        size = format_bytes(o["tool_output_bytes"])
        rows = "\n".join(
            f"  {label:<9}{ms(self.turn[mode]):>11}{ms(self.rollout[mode]):>11}"
            f"{ms(self.cpu_per_turn[mode]):>18}"
            for mode, label in (("off", "no store"), ("on", "Redis"))
        )
        return "\n".join(
            [
                f"benchmarks.store: the Redis store against no store, both middlewares "
                f"{MIDDLEWARES[o['full_context']]}; server in its own process; medians of "
                f"{o['repeat']} repetitions, interleaved.",
                "",
                f"Per turn: a tool-call rollout of {o['turns']} turns, {size} tool outputs, "
                "the model at zero cost",
                f"  {'store':<9}{'turn':>11}{'rollout':>11}{'server CPU/turn':>18}",
                rows,
                f"  {'ratio':<9}{r['turn']:>11.3f}{r['rollout']:>11.3f}{r['cpu_per_turn']:>18.3f}",
                "",
                f"Hydration: one turn continuing a {o['chain_turns']}-turn conversation "
                "(send to terminal event)",
                f"  on the connection holding it in cache   {ms(self.cached_turn):>9}",
                f"  on a new socket, hydrated from Redis    {ms(self.hydrated_turn):>9}",
                f"  ratio {r['hydration']:.3f} (hydrating adds "
                f"{ms(self.hydrated_turn - self.cached_turn)})",
                "",
                f"Throughput: {o['sockets']} sockets at once, {o['socket_turns']} turns each",
                f"  no store {self.turns_per_second['off']:,.0f} turns/s, Redis "
                f"{self.turns_per_second['on']:,.0f} turns/s, ratio {r['turns_per_second']:.3f}",
                "",
                f"Store counters (RedisStore timeout {o['store_timeout']:g} s): "
                + ", ".join(
                    f"{name} {self.store.get(name, 0):,} (expected "
                    f"{'at least ' if name == 'store_writes' else ''}{self.expected[name]:,})"
                    for name in ("store_writes", "store_hydrations", "store_failures")
                ),
            ]
        )


# ----------------------------------------------------------------------------- the run


def _delete_keys(redis_url: str, prefix: str) -> None:
    """Delete the run's keys from Redis (they expire by themselves otherwise)."""
    import redis

    with contextlib.suppress(Exception), redis.Redis.from_url(redis_url) as client:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


def run(options: StoreBenchOptions) -> StoreBenchReport:
    """Start the server subprocess, measure, stop it, delete the run's keys; the report."""
    raise_file_limit()
    prefix = f"ws_mode_bench_{secrets.token_hex(6)}"
    report = StoreBenchReport(options=asdict(options), prefix=prefix)
    arguments = ["--serve", "--redis", options.redis_url, "--prefix", prefix]
    arguments += ["--full-context", options.full_context]
    arguments += ["--store-timeout", repr(options.store_timeout)]
    try:
        with (
            server_process(
                "benchmarks.store", arguments, ready_path=STATS_PATH,
                lifetime=24 * 3600.0, backlog=BACKLOG,
            ) as server,
            HttpClient(server.base_url, timeout=options.timeout) as http,
        ):  # fmt: skip
            counters = _Counters(http)
            measure_turns(server.base_url, options, counters, report)
            measure_hydration(server.base_url, options, counters, report)
            measure_throughput(server.base_url, options, counters, report)
            stats = counters.wait_writes()
    except ServerStartError as exc:
        raise StoreBenchError(f"the bench server did not start: {exc}") from exc
    except (OSError, InvalidHandshake, httpx.TransportError, HttpStatusError) as exc:
        raise StoreBenchError(f"talking to the bench server failed: {exc!r}") from exc
    finally:
        _delete_keys(options.redis_url, prefix)
    names = ("store_writes", "store_hydrations", "store_failures")
    report.store = {name: stats["on"][name] for name in names}
    report.store_off = {name: stats["off"][name] for name in names}
    report.expected = {
        "store_writes": counters.written, "store_hydrations": counters.hydrations,
        "store_failures": 0,
    }  # fmt: skip
    return report


# ----------------------------------------------------------------------------- encryption


@dataclass
class EncryptionReport:
    """What encrypting records at rest costs per stored turn (:func:`measure_encryption`): per
    mode (``plain``, ``encrypted``), medians over the repetitions."""

    options: dict[str, Any]
    write: dict[str, float] = field(default_factory=dict)  # per stored turn: its put
    hydration: dict[str, float] = field(default_factory=dict)  # per turn of the conversation
    cpu: dict[str, float] = field(default_factory=dict)  # this process's CPU per stored turn
    record_bytes: dict[str, float] = field(default_factory=dict)  # what Redis keeps per record

    def ratios(self) -> dict[str, float]:
        """Encrypted / plain, for each measurement."""
        return {
            name: values["encrypted"] / values["plain"] if values.get("plain") else 0.0
            for name, values in (
                ("write", self.write),
                ("hydration", self.hydration),
                ("cpu", self.cpu),
                ("record_bytes", self.record_bytes),
            )
        }

    def text(self) -> str:
        """The report as the command prints it."""
        o, r, ms = self.options, self.ratios(), format_seconds
        rows = [
            f"  {mode:<10}{ms(self.write[mode]):>11}{ms(self.hydration[mode]):>12}"
            f"{ms(self.cpu[mode]):>11}{format_bytes(self.record_bytes[mode]):>11}"
            for mode in ("plain", "encrypted")
        ]
        return "\n".join(
            [
                f"benchmarks.store --encryption: RedisStore with an encryption key (AES-256-GCM) "
                f"against none, per stored turn; conversations of {o['turns']} turns, "
                f"{format_bytes(o['tool_output_bytes'])} tool outputs; medians of {o['repeat']} "
                "repetitions, interleaved.",
                "",
                f"  {'records':<10}{'write':>11}{'hydration':>12}{'CPU':>11}{'in Redis':>11}",
                *rows,
                f"  {'ratio':<10}{r['write']:>11.3f}{r['hydration']:>12.3f}{r['cpu']:>11.3f}"
                f"{r['record_bytes']:>11.3f}",
            ]
        )


def _records(turns: int, tool_output_bytes: int) -> list[StoredResponse]:
    """A conversation as its records: each turn a tool output in, a call and a message out, the
    response object; about what the reference server's rollout stores."""
    chain = f"resp_{secrets.token_hex(16)}"
    records: list[StoredResponse] = []
    for turn in range(turns):
        response_id = chain if turn == 0 else f"resp_{secrets.token_hex(16)}"
        output = secrets.token_urlsafe(tool_output_bytes)[:tool_output_bytes]
        item = {"type": "function_call_output", "call_id": f"call_{turn}", "output": output}
        call = {
            "type": "function_call", "id": f"fc_{turn}", "call_id": f"call_{turn + 1}",
            "name": "lookup", "arguments": orjson.dumps({"step": turn}).decode(),
        }  # fmt: skip
        response = {
            "id": response_id, "object": "response", "status": "completed",
            "model": "reference", "output": [call], "usage": {"total_tokens": 100},
        }  # fmt: skip
        records.append(
            StoredResponse(
                id=response_id,
                parent_id=records[-1].id if records else None,
                chain_id=chain,
                input=orjson.dumps(item),
                output=orjson.dumps(call),
                response=orjson.dumps(response),
            )
        )
    return records


async def _stored_turns(store: Any, records: list[StoredResponse]) -> tuple[float, float, float]:
    """Write `records` one stored turn at a time, then hydrate the last: the wall time per
    write, per turn of the hydration, and this process's CPU per stored turn."""
    cpu = time.process_time()
    started = time.perf_counter()
    for record in records:
        await store.put("bench", record)
    wrote = time.perf_counter()
    found = await store.get_ancestors("bench", records[-1].id)
    hydrated = time.perf_counter()
    if found != records:
        raise StoreBenchError("a hydration did not give back the records written")
    turns = len(records)
    return (
        (wrote - started) / turns,
        (hydrated - wrote) / turns,
        (time.process_time() - cpu) / turns,
    )


def measure_encryption(
    redis_url: str, *, turns: int = 25, repeat: int = 5, tool_output_bytes: int = 4096
) -> EncryptionReport:
    """What encrypting records at rest costs per stored turn, from one interleaved run (see
    the module's docstring); the run's keys are deleted after it."""
    from ws_mode.redis_store import RedisStore

    prefix = f"ws_mode_bench_{secrets.token_hex(6)}"
    report = EncryptionReport(
        {"turns": turns, "repeat": repeat, "tool_output_bytes": tool_output_bytes}
    )
    key = secrets.token_bytes(32)

    async def measure() -> dict[str, list[tuple[float, float, float]]]:
        stores = {
            "plain": RedisStore(redis_url, prefix=f"{prefix}:p", ttl_seconds=TTL_SECONDS),
            "encrypted": RedisStore(
                redis_url, prefix=f"{prefix}:e", ttl_seconds=TTL_SECONDS, encryption_keys=[key]
            ),
        }
        seen: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in stores}
        try:
            for store in stores.values():  # a warm-up each: connections, scripts
                await _stored_turns(store, _records(2, tool_output_bytes))
            for repetition in range(repeat):
                for mode in _order(repetition, ("plain", "encrypted")):
                    records = _records(turns, tool_output_bytes)
                    seen[mode].append(await _stored_turns(stores[mode], records))
            for mode, store in stores.items():
                records = _records(1, tool_output_bytes)
                await store.put("bench", records[0])
                held = await store.client.hstrlen(
                    store.chain_key("bench", records[0].id), records[0].id
                )
                report.record_bytes[mode] = float(held)
        finally:
            for store in stores.values():
                await store.aclose()
        return seen

    try:
        seen = asyncio.run(measure())
    finally:
        _delete_keys(redis_url, prefix)
    for mode, values in seen.items():
        report.write[mode] = median(value[0] for value in values)
        report.hydration[mode] = median(value[1] for value in values)
        report.cpu[mode] = median(value[2] for value in values)
    return report


# ----------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.store",
        description="Measure what the Redis store costs WebSocket mode: per-turn overhead, "
        "hydrating a long conversation on a new socket, and turns/s of many sockets at once.",
    )
    defaults = StoreBenchOptions(redis_url="")
    parser.add_argument("--redis", required=True, metavar="URL", help="a Redis to measure with")
    for name, what in [
        ("turns", "turns of each rollout (per-turn overhead)"),
        ("tool_output_bytes", "size of each tool output"),
        ("repeat", "repetitions of each measurement; medians are printed"),
        ("chain_turns", "turns of the conversation a new socket continues (hydration)"),
        ("sockets", "sockets open at once (throughput)"),
        ("socket_turns", "turns each of those sockets runs"),
    ]:
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=default, help=f"{what} (default: {default})")
    parser.add_argument(
        "--full-context",
        choices=("always", "on_miss"),
        default=defaults.full_context,
        help="both middlewares drop-in (always) or cache-aware with the reference's renderer "
        "(on_miss) (default: %(default)s)",
    )
    parser.add_argument(
        "--store-timeout",
        type=float,
        default=defaults.store_timeout,
        help="the RedisStore's timeout per call, in seconds (default: %(default)g)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--encryption",
        action="store_true",
        help="measure instead what encrypting the records at rest costs per stored turn "
        "(--turns, --tool-output-bytes, --repeat)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.store --redis URL``: measure, print the report; 0 when the
    store's counters are what the run expects, 1 when not, 2 when it could not measure. With
    ``--serve``, be the bench server's process instead (:func:`serve`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve" in argv:
        return serve(argv)
    args = _parser().parse_args(argv)
    if args.encryption:
        encryption = measure_encryption(
            args.redis, turns=args.turns, repeat=args.repeat,
            tool_output_bytes=args.tool_output_bytes,
        )  # fmt: skip
        shown = {**asdict(encryption), "ratios": encryption.ratios()}
        print(json.dumps(shown, indent=2) if args.json else encryption.text())
        return 0
    try:
        options = StoreBenchOptions(
            redis_url=args.redis, turns=args.turns, tool_output_bytes=args.tool_output_bytes,
            repeat=args.repeat, chain_turns=args.chain_turns, sockets=args.sockets,
            socket_turns=args.socket_turns, full_context=args.full_context,
            store_timeout=args.store_timeout,
        )  # fmt: skip
        report = run(options)
    except (ValueError, StoreBenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
