"""The server side of ``ws-mode bench``: one process serving every mode the benchmark compares.

The benchmark starts this module as a subprocess (``python -m ws_mode.toolkit.bench.server --spec
JSON --fd N``, through :func:`ws_mode.testing._loopback.server_process`, which binds the loopback
socket and passes it down), so the server and the clients never share a GIL. It serves, under
one uvicorn server:

- for each model speed ``i`` (``ServerSpec.speeds``), one reference app
  (:mod:`ws_mode.toolkit.reference`) at ``/s{i}/v1/responses``, wrapped for the three modes:

  - plain HTTP ``POST /s{i}/v1/responses`` (through both middlewares, which pass it on),
  - WebSocket mode drop-in at ``/s{i}/always/v1/responses`` (``full_context="always"``, no
    renderer),
  - WebSocket mode cache-aware at ``/s{i}/on_miss/v1/responses`` (``full_context="on_miss"``,
    ``renderer=render_items``);

- the forwarding microbenchmark (:mod:`ws_mode.toolkit.bench.forward`): ``/forward/v1/responses``,
  the
  middleware in front of a raw ASGI handler that streams ``ServerSpec.forward_events``
  pre-encoded ``response.output_text.delta`` SSE events, ``/forward/objects/v1/responses``, the
  same events handed as objects (``Turn.send_event``), and ``/forward/bare``, a bare Starlette
  WebSocket endpoint that sends the same events, already encoded as frames;

- ``/bench/stats`` (``GET`` reads, ``POST`` reads then resets): each reference app's
  :class:`~ws_mode.toolkit.reference.ReferenceStats`, the process's CPU time, RSS and peak RSS
  (reset with the counters, on Linux); ``POST /bench/profile`` starts, stops and dumps cProfile
  profiles of the server.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, ws_max_size

from ..measure import memory, reset_peak_rss
from .forward import (
    BARE_PATH,
    FORWARD_HANDLER_PATH,
    FORWARD_PATH,
    OBJECTS_HANDLER_PATH,
    OBJECTS_PATH,
    ForwardHandler,
    forward_frames,
)

__all__ = [
    "PROFILE_PATH",
    "STATS_PATH",
    "Dispatch",
    "Profiles",
    "ServerSpec",
    "build_bench_app",
    "control_routes",
    "main",
    "mode_path",
    "process_stats",
]

STATS_PATH: Final = "/bench/stats"
PROFILE_PATH: Final = "/bench/profile"


@dataclass(frozen=True)
class ServerSpec:
    """What the benchmark server serves.

    Attributes:
        tool_calls: tool calls the reference model asks for before it answers.
        speeds: the reference model's ``tokens_per_second`` for each reference app (0 = free).
        time_to_first_token: seconds each reference response waits before its first token.
        forward_events: deltas each forwarding-microbenchmark response streams.
        forward_batch: events per body chunk the forwarding handler sends.
    """

    tool_calls: int = 24
    speeds: tuple[float, ...] = (0.0,)
    time_to_first_token: float = 0.0
    forward_events: int = 0
    forward_batch: int = 1

    def to_json(self) -> str:
        """The spec as the ``--spec`` argument."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerSpec:
        """The spec of a ``--spec`` argument."""
        fields = json.loads(text)
        fields["speeds"] = tuple(float(speed) for speed in fields["speeds"])
        return cls(**fields)


def mode_path(speed_index: int, mode: str) -> str:
    """The path of a mode (``"http"``, ``"always"`` or ``"on_miss"``) for speed ``i``."""
    if mode == "http":
        return f"/s{speed_index}/v1/responses"
    return f"/s{speed_index}/{mode}/v1/responses"


# ----------------------------------------------------------------------------- process stats


def process_stats() -> dict[str, Any]:
    """This process's CPU time (user + system, all threads), RSS and peak RSS."""
    current = memory()
    return {"cpu_seconds": time.process_time(), "rss": current.rss, "peak_rss": current.peak}


# ----------------------------------------------------------------------------- the app


class Profiles:
    """Named cProfile profiles of the server's event loop thread; one runs at a time."""

    def __init__(self) -> None:
        self.profiles: dict[str, cProfile.Profile] = {}
        self.running: cProfile.Profile | None = None

    def start(self, name: str) -> None:
        """Start (or resume) profile ``name``, stopping the one running."""
        self.stop()
        profile = self.profiles.setdefault(name, cProfile.Profile())
        profile.enable()
        self.running = profile

    def stop(self) -> None:
        """Stop the profile running, if any."""
        if self.running is not None:
            self.running.disable()
            self.running = None

    def dump(self, directory: str) -> list[str]:
        """Write each profile to ``directory/NAME.pstats`` and forget them; the files."""
        self.stop()
        Path(directory).mkdir(parents=True, exist_ok=True)
        written = []
        for name, profile in self.profiles.items():
            path = Path(directory) / f"{name}.pstats"
            profile.dump_stats(path)
            written.append(str(path))
        self.profiles.clear()
        return written


class Dispatch:
    """Routes by path prefix, leaving ``path`` and ``root_path`` untouched (the middlewares
    match their full paths)."""

    def __init__(self, prefixes: Sequence[tuple[str, ASGIApp]], default: ASGIApp) -> None:
        self.prefixes = list(prefixes)
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            for prefix, app in self.prefixes:
                if path.startswith(prefix):
                    await app(scope, receive, send)
                    return
        await self.default(scope, receive, send)


def control_routes(
    stats: Callable[[], dict[str, Any]], reset: Callable[[], None]
) -> list[BaseRoute]:
    """The routes the bench drives a measured server with: ``STATS_PATH`` (``GET`` answers
    ``stats()``; ``POST`` answers it, then calls ``reset()`` and resets the peak RSS) and
    ``PROFILE_PATH`` (start, stop and dump cProfile profiles of the event loop's thread)."""
    profiles = Profiles()

    async def stats_route(request: Request) -> Response:
        answer = stats()
        if request.method == "POST":
            reset()
            reset_peak_rss()
        return JSONResponse(answer)

    async def profile_route(request: Request) -> Response:
        command = await request.json()
        action = command.get("action")
        if action == "start":
            profiles.start(str(command["name"]))
            return JSONResponse({"ok": True})
        if action == "stop":
            profiles.stop()
            return JSONResponse({"ok": True})
        if action == "dump":
            return JSONResponse({"files": profiles.dump(str(command["dir"]))})
        return JSONResponse({"error": f"unknown action {action!r}"}, status_code=400)

    return [
        Route(STATS_PATH, stats_route, methods=["GET", "POST"]),
        Route(PROFILE_PATH, profile_route, methods=["POST"]),
    ]


def build_bench_app(spec: ServerSpec) -> ASGIApp:
    """Everything the benchmark measures, in one ASGI app (see the module's docstring)."""
    from ..reference import ReferenceConfig, create_app, render_items

    limits = Limits()
    references: list[Starlette] = []
    prefixes: list[tuple[str, ASGIApp]] = []
    for index, speed in enumerate(spec.speeds):
        handler_path = mode_path(index, "http")
        reference = create_app(
            ReferenceConfig(
                tool_calls=spec.tool_calls,
                tokens_per_second=speed,
                time_to_first_token=spec.time_to_first_token if speed else 0.0,
            ),
            path=handler_path,
        )
        references.append(reference)
        drop_in = WebSocketModeMiddleware(
            reference,
            path=mode_path(index, "always"),
            handler_path=handler_path,
            full_context="always",
            limits=limits,
        )
        cache_aware = WebSocketModeMiddleware(
            drop_in,
            path=mode_path(index, "on_miss"),
            handler_path=handler_path,
            full_context="on_miss",
            renderer=render_items,
            limits=limits,
        )
        prefixes.append((f"/s{index}/", cache_aware))

    forward = WebSocketModeMiddleware(
        Dispatch(
            [(FORWARD_HANDLER_PATH, ForwardHandler(spec.forward_events, spec.forward_batch))],
            PlainTextResponse("not found", status_code=404),
        ),
        path=FORWARD_PATH,
        handler_path=FORWARD_HANDLER_PATH,
        limits=limits,
    )
    objects = WebSocketModeMiddleware(
        Dispatch(
            [(OBJECTS_HANDLER_PATH, ForwardHandler(spec.forward_events, 1, objects=True))],
            PlainTextResponse("not found", status_code=404),
        ),
        path=OBJECTS_PATH,
        handler_path=OBJECTS_HANDLER_PATH,
        limits=limits,
    )
    bare_frames = forward_frames(spec.forward_events)

    async def bare(websocket: WebSocket) -> None:
        await websocket.accept()
        with contextlib.suppress(Exception):  # the client left
            while True:
                await websocket.receive_text()
                for frame in bare_frames:
                    await websocket.send_text(frame)

    def stats() -> dict[str, Any]:
        return {
            "references": [_reference_stats(app) for app in references],
            **process_stats(),
        }

    def reset() -> None:
        for app in references:
            app.state.reference_stats.reset()

    tools = Starlette(routes=[*control_routes(stats, reset), WebSocketRoute(BARE_PATH, bare)])
    prefixes.append(("/forward/v1/", forward))
    prefixes.append(("/forward/objects/", objects))
    return Dispatch(prefixes, tools)


def _reference_stats(app: Starlette) -> dict[str, Any]:
    """The reference app's counters: requests, bytes_parsed, items_seen, tokens_rendered,
    resumed, cpu_seconds."""
    return dict(app.state.reference_stats.snapshot())


# ----------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.server --spec JSON --fd N``: serve on the parent's
    socket."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.bench.server")
    parser.add_argument("--spec", required=True, help="a ServerSpec as JSON")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    spec = ServerSpec.from_json(args.spec)
    # Warm what the first request would otherwise pay for: the tokenizer's training.
    from ..reference import render_items

    render_items([{"role": "user", "content": "warm up"}])
    serve_inherited(
        build_bench_app(spec),
        args,
        access_log=False,
        ws_max_size=ws_max_size(),
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
