"""What the proxy hop costs per turn: ``ws-mode proxy`` against the same upstream over HTTP.

Three processes on loopback: a cheap upstream (``benchmarks/http_clients.py``'s, a
raw ASGI app that answers a function call per turn without parsing the body, so the upstream itself
costs next to nothing), the proxy (``WebSocketModeMiddleware`` in front of
``ws_mode.proxy.create_proxy(upstream)``, under uvicorn with the WebSocket implementation
``ws-mode proxy`` runs (``--ws``, default ``batched``; one proxy process per ``--ws`` given),
with a route reporting its CPU time), and this driver. Each repetition runs, in an order rotated
every repetition, the same agent rollout (:mod:`ws_mode.toolkit.rollout`, 25 turns, 4 KiB tool
outputs by default):

- **direct**: ``run_http`` straight at the upstream (the whole history every turn),
- **socket (WS)**: ``run_socket`` through the proxy running WS (new items only; the middleware
  rebuilds the body, the proxy POSTs it upstream and streams the events back),
- **http via proxy**: ``run_http`` through the (first) proxy (plain HTTP forwarding),

and reads the proxy process's CPU time after every turn, so each turn's proxy CPU is known (the
read's own cost, measured apart, is taken off). Medians over the repetitions; early turn =
turns 2-4, late = the last three tool-call turns (about 93 KiB of history at the defaults)::

    python -m benchmarks.proxy_hop
    python -m benchmarks.proxy_hop --ws websockets-sansio --ws batched
    python -m benchmarks.proxy_hop --repeat 9 --profile prof/   # cProfile the
    proxy's socket turns
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import orjson
from starlette.types import Receive, Scope, Send

from ws_mode import WebSocketModeMiddleware
from ws_mode._protocol import json_answer
from ws_mode.proxy import create_proxy
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, server_process
from ws_mode.toolkit.cli.common import WS_IMPLEMENTATIONS
from ws_mode.toolkit.measure import format_bytes, format_seconds, median
from ws_mode.toolkit.rollout import RolloutResult, run_http, run_socket

from .http_clients import cheap_upstream

CPU_PATH: Final = "/_hop/cpu"
PROFILE_PATH: Final = "/_hop/profile"
DIRECT: Final = "direct"
SOCKET: Final = "socket"
HTTP_VIA_PROXY: Final = "http via proxy"
#: The WebSocket implementation ``ws-mode proxy`` runs by default.
DEFAULT_WS: Final = "batched"

# ----------------------------------------------------------------------------- the proxy process


class HopServer:
    """The proxy under test, plus ``GET /_hop/cpu`` (this process's CPU seconds) and
    ``POST /_hop/profile?start|stop|dump=PATH`` (cProfile of the event loop's thread)."""

    def __init__(self, upstream: str) -> None:
        self.app = WebSocketModeMiddleware(create_proxy(upstream))
        self.profile: cProfile.Profile | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the two routes; everything else goes to the proxy."""
        path = scope.get("path", "")
        if scope["type"] == "http" and path in (CPU_PATH, PROFILE_PATH):
            answer = orjson.dumps({"cpu_seconds": time.process_time()})
            if path == PROFILE_PATH:
                self._control(scope.get("query_string", b"").decode())
            for message in json_answer("http.response", 200, answer):
                await send(message)
            return
        await self.app(scope, receive, send)

    def _control(self, query: str) -> None:
        command, _, argument = query.partition("=")
        if command == "start":
            self.profile = self.profile or cProfile.Profile(time.thread_time)
            self.profile.enable()
        elif command == "stop" and self.profile is not None:
            self.profile.disable()
        elif command == "dump" and self.profile is not None:
            self.profile.disable()
            self.profile.dump_stats(argument)
            self.profile = None


def serve_child(argv: Sequence[str]) -> None:
    """The proxy's process (``--serve-proxy --upstream URL --ws NAME --fd FD``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-proxy", action="store_true")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--ws", choices=tuple(WS_IMPLEMENTATIONS), required=True)
    add_child_arguments(parser)
    arguments = parser.parse_args(argv)
    ws = WS_IMPLEMENTATIONS[arguments.ws]
    serve_inherited(HopServer(arguments.upstream), arguments, lifespan="on", ws=ws)


# ----------------------------------------------------------------------------- the driver


class ProxyCpu:
    """Reads the proxy's CPU time over one keep-alive connection."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=30.0)
        self.overhead = 0.0

    def read(self) -> float:
        """The proxy process's CPU seconds so far."""
        return float(self.client.get(CPU_PATH).json()["cpu_seconds"])

    def calibrate(self, count: int = 30) -> None:
        """Measure what one read costs the proxy (taken off every per-turn figure)."""
        readings = [self.read() for _ in range(count + 1)]
        self.overhead = median(b - a for a, b in itertools.pairwise(readings))

    def profile(self, command: str) -> None:
        """Start, stop or dump (``dump=PATH``) the proxy's cProfile."""
        self.client.post(PROFILE_PATH + "?" + command).raise_for_status()


def _run(
    mode: str, upstream: str, proxy: str, cpu: ProxyCpu, options: dict[str, Any]
) -> tuple[RolloutResult, list[float]]:
    """One rollout in ``mode`` (``direct``, ``http via proxy`` or a socket mode): its result
    and the proxy's CPU seconds per turn."""
    readings = [cpu.read()]

    def on_turn(turn: int, seconds: float) -> None:
        readings.append(cpu.read())

    runner: Callable[..., RolloutResult] = run_socket if mode.startswith(SOCKET) else run_http
    result = runner(upstream if mode == DIRECT else proxy, on_turn=on_turn, **options)
    per_turn = [max(0.0, b - a - cpu.overhead) for a, b in itertools.pairwise(readings)]
    return result, per_turn


def measure(arguments: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Run every mode ``repeat`` times, interleaved; per mode: per-turn medians and totals.
    One proxy process per ``--ws`` implementation; a socket mode per proxy, plain HTTP through
    the first."""
    turns: int = arguments.turns
    options = {"turns": turns, "tool_output_bytes": arguments.tool_output_bytes}
    implementations: list[str] = arguments.ws or [DEFAULT_WS]
    modes = [DIRECT, *(f"{SOCKET} ({ws})" for ws in implementations), HTTP_VIA_PROXY]
    with cheap_upstream(turns - 1) as upstream, contextlib.ExitStack() as stack:
        proxies: dict[str, tuple[str, ProxyCpu]] = {}
        for ws in implementations:
            child = ["--serve-proxy", "--upstream", upstream.base_url + "/v1", "--ws", ws]
            proxy = stack.enter_context(server_process("benchmarks.proxy_hop", child))
            cpu = ProxyCpu(proxy.base_url)
            cpu.calibrate()
            proxies[ws] = (proxy.base_url, cpu)
        first = proxies[implementations[0]]
        through = {DIRECT: first, HTTP_VIA_PROXY: first}
        through.update({f"{SOCKET} ({ws})": proxies[ws] for ws in implementations})
        runs: dict[str, list[tuple[RolloutResult, list[float]]]] = {m: [] for m in modes}
        for mode in modes:  # warm-up, unmeasured
            base_url, cpu = through[mode]
            _run(mode, upstream.base_url, base_url, cpu, options)
        for rep in range(arguments.repeat):
            print(f"proxy_hop: repetition {rep + 1}/{arguments.repeat}", file=sys.stderr)
            shift = rep % len(modes)
            for mode in [*modes[shift:], *modes[:shift]]:
                base_url, cpu = through[mode]
                profiling = arguments.profile and mode.startswith(SOCKET)
                if profiling:
                    cpu.profile("start")
                runs[mode].append(_run(mode, upstream.base_url, base_url, cpu, options))
                if profiling:
                    cpu.profile("stop")
        if arguments.profile:
            Path(arguments.profile).mkdir(parents=True, exist_ok=True)
            for ws, (_, cpu) in proxies.items():
                cpu.profile(f"dump={Path(arguments.profile).resolve() / f'socket-{ws}.pstats'}")
        overhead = first[1].overhead
    summary: dict[str, dict[str, list[float]]] = {}
    for mode, results in runs.items():
        count = min(len(result.turn_seconds) for result, _ in results)
        summary[mode] = {
            "wall": [median(r.turn_seconds[t] for r, _ in results) for t in range(count)],
            "cpu": [median(c[t] for _, c in results) for t in range(count)],
            "sent": [median(r.turn_bytes[t] for r, _ in results) for t in range(count)],
            "total_cpu": [median(sum(c) for _, c in results)],
            "overhead": [overhead],
        }
    return summary


def report(summary: dict[str, dict[str, list[float]]], turns: int) -> str:
    """The table of per-turn medians, early and late, and the proxy's added latency."""
    early = range(1, min(4, turns))
    late = range(max(1, turns - 4), turns - 1)
    direct_sent = summary[DIRECT]["sent"]
    late_history = median(direct_sent[t] for t in late)

    def window(mode: str, key: str, turns_in: range) -> float:
        return median(summary[mode][key][t] for t in turns_in)

    lines = [
        f"  {'mode':<30} {'early wall':>11} {'late wall':>10} {'early CPU':>10} "
        f"{'late CPU':>9} {'CPU/rollout':>12}",
        "  " + "-" * 87,
    ]
    for mode in summary:
        lines.append(
            f"  {mode:<30} {format_seconds(window(mode, 'wall', early)):>11} "
            f"{format_seconds(window(mode, 'wall', late)):>10} "
            f"{format_seconds(window(mode, 'cpu', early)):>10} "
            f"{format_seconds(window(mode, 'cpu', late)):>9} "
            f"{format_seconds(summary[mode]['total_cpu'][0]):>12}"
        )
    lines += [
        f"  proxy CPU = the proxy process's, per turn (the CPU read's own "
        f"{format_seconds(summary[DIRECT]['overhead'][0])} taken off; 'direct' shows the noise).",
        f"  late turns carry {format_bytes(late_history)} of history (direct HTTP body).",
    ]
    for mode in summary:
        if mode.startswith(SOCKET):
            added_early = window(mode, "wall", early) - window(DIRECT, "wall", early)
            added_late = window(mode, "wall", late) - window(DIRECT, "wall", late)
            lines.append(
                f"  {mode} vs direct HTTP, added wall per turn: early "
                f"{format_seconds(added_early)}, late {format_seconds(added_late)}."
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure; print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve-proxy" in argv:
        serve_child(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=25, help="model calls per rollout (25)")
    parser.add_argument("--tool-output-bytes", type=int, default=4096, help="(4096)")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved repetitions (7)")
    parser.add_argument("--profile", metavar="DIR", help="cProfile the proxy's socket turns")
    parser.add_argument(
        "--ws",
        action="append",
        choices=tuple(WS_IMPLEMENTATIONS),
        help=f"a proxy with this uvicorn WebSocket implementation, as ws-mode proxy --ws "
        f"(repeatable: one proxy each, interleaved; default {DEFAULT_WS})",
    )
    arguments = parser.parse_args(argv)
    summary = measure(arguments)
    print(
        f"Proxy hop: rollouts of {arguments.turns} turns, {arguments.tool_output_bytes} B tool "
        f"outputs, cheap upstream; median of {arguments.repeat}, modes interleaved; early = "
        f"turns 2-4, late = turns {arguments.turns - 3}-{arguments.turns - 1}."
    )
    print(report(summary, arguments.turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
