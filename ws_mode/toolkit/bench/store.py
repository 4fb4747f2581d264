"""What the Redis store costs, measured: per-turn overhead, hydration, and throughput.

``python -m ws_mode.toolkit.bench.store --redis redis://127.0.0.1:6379/0`` starts the reference
server behind two middlewares in a subprocess on loopback
(:mod:`ws_mode.toolkit.bench.store_server`): one without a store, one with a
:class:`~ws_mode.redis_store.RedisStore` on ``--redis`` (keys under a prefix of their own, deleted
at the end). Interleaved in one run, it measures:

- **per turn**: a tool-call rollout (:func:`ws_mode.toolkit.rollout.run_socket`) at zero model
  cost, with the store and without, order alternated each repetition: each turn's wall time
  (send to terminal event), the rollout's, and the server's CPU per turn;
- **hydration**: one turn continuing a ``--chain-turns`` conversation, on a new socket (its
  chain hydrated from Redis) and on the connection that holds it in its cache; both must give
  the same output;
- **throughput**: ``--sockets`` sockets open at once, each running ``--socket-turns`` turns
  concurrently, with the store and without: turns per second.

It prints what it measured and the ratios; the project's goals for them are in
docs/benchmarks.md. Needs the ``cli`` and ``redis`` extras.
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
from dataclasses import asdict
from typing import Any

import httpx
from websockets.exceptions import InvalidHandshake

from ws_mode.testing._client import AsyncSocket, SyncSocket, connect, connect_async
from ws_mode.testing._loopback import ServerStartError, server_process

from ..agent import (
    DEFAULT_INSTRUCTIONS,
    DEFAULT_PROMPT,
    DEFAULT_TOOLS,
    RolloutError,
    request_fields,
    terminal_response,
    tool_output,
    user_message,
)
from ..http_client import HttpClient, HttpStatusError
from ..measure import median
from ..reference.request import OVERRIDE_KEY
from ..rollout import run_socket
from .load_server import raise_file_limit
from .store_report import StoreBenchError, StoreBenchOptions, StoreBenchReport
from .store_server import BACKLOG, PATHS, STATS_PATH

__all__ = ["StoreBenchError", "StoreBenchOptions", "StoreBenchReport", "main", "run"]


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
    arguments = ["--redis", options.redis_url, "--prefix", prefix]
    arguments += ["--full-context", options.full_context]
    arguments += ["--store-timeout", repr(options.store_timeout)]
    try:
        with (
            server_process(
                "ws_mode.toolkit.bench.store_server", arguments, ready_path=STATS_PATH,
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ws_mode.toolkit.bench.store",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.store --redis URL``: measure, print the report; 0 when the
    store's counters are what the run expects, 1 when not, 2 when it could not measure."""
    args = _parser().parse_args(argv)
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
