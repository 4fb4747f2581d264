"""The server side of ``ws-mode bench``: one process serving every mode the benchmark compares.

The benchmark starts this module as a subprocess (``python -m ws_mode.bench_server --spec
JSON``), so the server and the clients never share a GIL. It serves, under one uvicorn server:

- for each model speed ``i`` (``ServerSpec.speeds``), one reference app
  (:mod:`ws_mode.reference`) at ``/s{i}/v1/responses``, wrapped for the three modes:

  - plain HTTP ``POST /s{i}/v1/responses`` (through both middlewares, which pass it on),
  - WebSocket mode drop-in at ``/s{i}/always/v1/responses`` (``full_context="always"``, no
    renderer),
  - WebSocket mode cache-aware at ``/s{i}/on_miss/v1/responses`` (``full_context="on_miss"``,
    ``renderer=render_items``);

- the forwarding microbenchmark: ``/forward/v1/responses``, the middleware in front of a raw
  ASGI handler that streams ``ServerSpec.forward_events`` pre-encoded
  ``response.output_text.delta`` SSE events, and ``/forward/bare``, a bare Starlette WebSocket
  endpoint that sends the same events, already encoded as frames;

- ``/bench/stats`` (``GET`` reads, ``POST`` reads then resets): each reference app's
  :class:`~ws_mode.reference.ReferenceStats`, the process's CPU time, RSS and peak RSS (reset
  with the counters, on Linux); ``POST /bench/profile`` starts, stops and dumps cProfile
  profiles of the server.

Once listening it prints one line, ``listening on http://127.0.0.1:PORT``, and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import re
import resource
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from .limits import Limits
from .middleware import WebSocketModeMiddleware

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "BARE_PATH",
    "FORWARD_PATH",
    "PROFILE_PATH",
    "STATS_PATH",
    "ServerSpec",
    "build_bench_app",
    "forward_frames",
    "main",
    "mode_path",
]

FORWARD_PATH: Final = "/forward/v1/responses"
FORWARD_HANDLER_PATH: Final = "/forward/handler"
BARE_PATH: Final = "/forward/bare"
STATS_PATH: Final = "/bench/stats"
PROFILE_PATH: Final = "/bench/profile"
READY_PREFIX: Final = "listening on "
WS_MARGIN: Final = 1024 * 1024

_DELTA_TEXT: Final = "tok "
_FORWARD_ITEM_ID: Final = "msg_forward"


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


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes (Linux); empty elsewhere."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for name in ("VmRSS", "VmHWM"):
        found = re.search(rf"^{name}:\s+(\d+)\s+kB", text, re.MULTILINE)
        if found:
            values[name] = int(found.group(1)) * 1024
    return values


def _peak_rss_fallback() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _reset_peak_rss() -> bool:
    """Start the peak RSS over from the current RSS (Linux >= 4.0); False when unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def process_stats() -> dict[str, Any]:
    """This process's CPU time (user + system, all threads), RSS and peak RSS."""
    status = _proc_status()
    return {
        "cpu_seconds": time.process_time(),
        "rss": status.get("VmRSS"),
        "peak_rss": status.get("VmHWM", _peak_rss_fallback()),
    }


# ----------------------------------------------------------------------------- forwarding


def _forward_response(response_id: str, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "forward",
        "output": [],
        "usage": None,
    }


def _delta(sequence_number: int) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": _FORWARD_ITEM_ID,
        "output_index": 0,
        "content_index": 0,
        "delta": _DELTA_TEXT,
        "logprobs": [],
        "sequence_number": sequence_number,
    }


def forward_frames(events: int, response_id: str = "resp_forward") -> list[str]:
    """The frames of one forwarding response: ``response.created``, ``events`` deltas,
    ``response.completed``: exactly what the middleware sends for the handler's stream."""
    created = {
        "type": "response.created",
        "sequence_number": 0,
        "response": _forward_response(response_id, "in_progress"),
    }
    completed = {
        "type": "response.completed",
        "sequence_number": events + 1,
        "response": _forward_response(response_id, "completed"),
    }
    deltas = [_delta(number) for number in range(1, events + 1)]
    return [orjson.dumps(event).decode() for event in (created, *deltas, completed)]


def _sse(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ForwardHandler:
    """A raw ASGI ``POST`` handler streaming ``events`` pre-encoded deltas as SSE, ``batch``
    events per body chunk, between a ``response.created`` and a ``response.completed``.

    It does no work per event beyond handing the chunk to ``send``: what it costs is the
    middleware's forwarding, not the handler."""

    def __init__(self, events: int, batch: int) -> None:
        deltas = [_sse(_delta(number)) for number in range(1, events + 1)]
        size = max(1, batch)
        self.chunks = [b"".join(deltas[i : i + size]) for i in range(0, len(deltas), size)]
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the request body
            message = await receive()
            more = message.get("more_body", False)
        response_id = "resp_" + secrets.token_hex(8)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        created = {
            "type": "response.created",
            "sequence_number": 0,
            "response": _forward_response(response_id, "in_progress"),
        }
        await send({"type": "http.response.body", "body": _sse(created), "more_body": True})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        completed = {
            "type": "response.completed",
            "sequence_number": self.events + 1,
            "response": _forward_response(response_id, "completed"),
        }
        await send({"type": "http.response.body", "body": _sse(completed), "more_body": False})


# ----------------------------------------------------------------------------- the app


class _Profiles:
    """Named cProfile profiles of the server's event loop thread; one runs at a time."""

    def __init__(self) -> None:
        self.profiles: dict[str, cProfile.Profile] = {}
        self.running: cProfile.Profile | None = None

    def start(self, name: str) -> None:
        self.stop()
        profile = self.profiles.setdefault(name, cProfile.Profile())
        profile.enable()
        self.running = profile

    def stop(self) -> None:
        if self.running is not None:
            self.running.disable()
            self.running = None

    def dump(self, directory: str) -> list[str]:
        self.stop()
        Path(directory).mkdir(parents=True, exist_ok=True)
        written = []
        for name, profile in self.profiles.items():
            path = Path(directory) / f"{name}.pstats"
            profile.dump_stats(path)
            written.append(str(path))
        self.profiles.clear()
        return written


class _Dispatch:
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


def build_bench_app(spec: ServerSpec) -> ASGIApp:
    """Everything the benchmark measures, in one ASGI app (see the module's docstring)."""
    from .reference import ReferenceConfig, create_app, render_items

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
        _Dispatch(
            [(FORWARD_HANDLER_PATH, ForwardHandler(spec.forward_events, spec.forward_batch))],
            PlainTextResponse("not found", status_code=404),
        ),
        path=FORWARD_PATH,
        handler_path=FORWARD_HANDLER_PATH,
        limits=limits,
    )
    bare_frames = forward_frames(spec.forward_events)
    profiles = _Profiles()

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

    async def stats_route(request: Request) -> Response:
        answer = stats()
        if request.method == "POST":
            for app in references:
                app.state.reference_stats.reset()
            _reset_peak_rss()
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

    tools = Starlette(
        routes=[
            Route(STATS_PATH, stats_route, methods=["GET", "POST"]),
            Route(PROFILE_PATH, profile_route, methods=["POST"]),
            WebSocketRoute(BARE_PATH, bare),
        ]
    )
    prefixes.append(("/forward/v1/", forward))
    return _Dispatch(prefixes, tools)


def _reference_stats(app: Starlette) -> dict[str, Any]:
    """The reference app's counters: requests, bytes_parsed, items_seen, tokens_rendered,
    resumed, cpu_seconds."""
    return dict(app.state.reference_stats.snapshot())


# ----------------------------------------------------------------------------- entry point


def _bound_port(server: uvicorn.Server) -> int:
    for listening in getattr(server, "servers", ()):
        for listener in listening.sockets:
            port: int = listener.getsockname()[1]
            return port
    raise RuntimeError("the server listens on no socket")


def serve(spec: ServerSpec, *, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve the benchmark app under uvicorn until SIGINT/SIGTERM; print the ready line."""
    import uvicorn

    app = build_bench_app(spec)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        ws_max_size=Limits().max_message_bytes + WS_MARGIN,
        timeout_graceful_shutdown=2,
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"{READY_PREFIX}http://{host}:{_bound_port(self)}", flush=True)

    Server(config).run()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.bench_server --spec JSON [--port N]``."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.bench_server")
    parser.add_argument("--spec", required=True, help="a ServerSpec as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    spec = ServerSpec.from_json(args.spec)
    # Warm what the first request would otherwise pay for: the tokenizer's training.
    from .reference import render_items

    render_items([{"role": "user", "content": "warm up"}])
    with contextlib.suppress(KeyboardInterrupt):
        serve(spec, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
