"""Upstream HTTP clients for ``ws_mode.proxy``, measured: httpx, httpcore and aiohttp.

The proxy POSTs each turn's whole request body upstream and streams the SSE answer back, so its
upstream client is on every turn's path. This script measures, per request, what each client
costs the process that sends it: CPU time on the event loop's thread and wall latency, for

- a 2 KiB body with a short SSE answer (the fixed cost of a request),
- a 100 KiB body (a late turn of a 25-turn tool loop with 4 KiB tool outputs),
- a 1 MiB body,

against a cheap upstream on loopback in its own process (uvicorn, a raw ASGI app that reads the
body without parsing it and streams a tool-call turn's 8 small events, one chunk each). Each
client keeps its own keep-alive pool, as the proxy does. Clients and sizes are interleaved
(client order rotated every repetition); every number is a median; ratios are to httpx's::

    python -m benchmarks.http_clients
    python -m benchmarks.http_clients --repeat 9 --requests 30

The same upstream serves ``benchmarks/proxy_hop.py`` (``--serve``, with
``--tool-calls``: it answers a function call until the body holds that many tool outputs, then a
message). Needs the ``cli`` extra and aiohttp (``pip install aiohttp``); uvloop when installed, as
under uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import orjson
from starlette.types import Receive, Scope, Send

from ws_mode._sse import encode_sse
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, server_process
from ws_mode.toolkit.measure import format_bytes, format_seconds, median

PATH: Final = "/v1/responses"
SIZES: Final = (2 * 1024, 100 * 1024, 1024 * 1024)
CLIENTS: Final = ("httpx", "httpcore", "aiohttp")
_OUTPUT_MARK: Final = b'"function_call_output"'
#: The reference server's way of asking for no tool call (the peer comparisons' conversation).
_NO_TOOLS_MARK: Final = b'"reference_tool_calls":"0"'

# ----------------------------------------------------------------------------- the upstream


def _response(response_id: str, status: str, output: list[Any]) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "cheap",
        "output": output,
        "usage": None,
    }


def turn_events(number: int, answer: bool) -> list[bytes]:
    """One turn's SSE events, encoded: a function call (8 events), or a short message (9)."""
    response_id = f"resp_cheap_{os.getpid()}_{number}"
    added: dict[str, Any]
    if answer:
        part = {"type": "output_text", "text": "done", "annotations": []}
        item: dict[str, Any] = {
            "type": "message",
            "id": f"msg_{number}",
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        # The whole part sequence, as a strict gateway (agentic-api's) insists on.
        added = {**item, "status": "in_progress", "content": []}
        at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        middle = [
            {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **at, "delta": "done"},
            {"type": "response.output_text.done", **at, "text": "done"},
            {"type": "response.content_part.done", **at, "part": part},
        ]
    else:
        item = {
            "type": "function_call",
            "id": f"fc_{number}",
            "call_id": f"call_{number}",
            "name": "read_file",
            "arguments": '{"path": "src/config.py"}',
            "status": "completed",
        }
        middle = [
            {"type": "response.function_call_arguments.delta", "item_id": item["id"], "delta": d}
            for d in ('{"path": ', '"src/config.py"}')
        ]
        middle.append(
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "arguments": item["arguments"],
            }
        )
        added = item
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response(response_id, "in_progress", [])},
        {"type": "response.in_progress", "response": _response(response_id, "in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        *middle,
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": _response(response_id, "completed", [item])},
    ]
    return [encode_sse({**event, "sequence_number": i}) for i, event in enumerate(events)]


class CheapUpstream:
    """A raw ASGI Responses upstream at zero cost: reads the body without parsing it, answers a
    function call until the body holds ``tool_calls`` tool outputs, then a message (a message
    at once when the metadata asks for no tool call as the reference server's does:
    ``"reference_tool_calls":"0"``)."""

    def __init__(self, tool_calls: int) -> None:
        self.tool_calls = tool_calls
        self.count = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request (any method and path)."""
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        answer = _NO_TOOLS_MARK in body or body.count(_OUTPUT_MARK) >= self.tool_calls
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in turn_events(next(self.count), answer):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def serve_child(argv: Sequence[str]) -> None:
    """The upstream's process (``--serve --tool-calls N --fd FD``), started by
    :func:`ws_mode.testing._loopback.server_process`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--tool-calls", type=int, default=1_000_000)
    add_child_arguments(parser)
    arguments = parser.parse_args(argv)
    serve_inherited(CheapUpstream(arguments.tool_calls), arguments)


def cheap_upstream(tool_calls: int = 1_000_000) -> Any:
    """Run the cheap upstream in its own process (a context manager yielding its
    :class:`~ws_mode.testing._loopback.ServerProcess`)."""
    arguments = ["--serve", "--tool-calls", str(tool_calls)]
    return server_process("benchmarks.http_clients", arguments)


# ----------------------------------------------------------------------------- the clients

Request = Callable[[str, list[tuple[bytes, bytes]], bytes], Awaitable[int]]
"""Send one POST (URL, headers, body), read the whole streamed answer; the bytes read."""


async def _httpx() -> tuple[Request, Callable[[], Awaitable[None]]]:
    import httpx

    from ws_mode.proxy import DEFAULT_LIMITS, DEFAULT_TIMEOUT

    client = httpx.AsyncClient(timeout=DEFAULT_TIMEOUT, limits=DEFAULT_LIMITS)

    async def request(url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        response = await client.send(
            client.build_request("POST", url, headers=headers, content=body), stream=True
        )
        read = 0
        try:
            async for chunk in response.aiter_raw():
                read += len(chunk)
        finally:
            await response.aclose()
        return read

    return request, client.aclose


async def _httpcore() -> tuple[Request, Callable[[], Awaitable[None]]]:
    import httpcore

    pool = httpcore.AsyncConnectionPool(max_connections=1000, max_keepalive_connections=100)
    timeouts = {"connect": 10.0, "read": 600.0, "write": 600.0, "pool": 600.0}

    async def request(url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        all_headers = [*headers, (b"host", url.split("/")[2].encode())]
        all_headers.append((b"content-length", str(len(body)).encode()))
        call = httpcore.Request(
            b"POST", url, headers=all_headers, content=body, extensions={"timeout": timeouts}
        )
        response = await pool.handle_async_request(call)
        read = 0
        try:
            async for chunk in response.aiter_stream():
                read += len(chunk)
        finally:
            await response.aclose()
        return read

    return request, pool.aclose


async def _aiohttp() -> tuple[Request, Callable[[], Awaitable[None]]]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=1000, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=600.0)
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )

    async def request(url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        read = 0
        async with session.post(url, data=body, headers=decoded) as response:
            async for chunk in response.content.iter_any():
                read += len(chunk)
        return read

    return request, session.close


FACTORIES: Final = {"httpx": _httpx, "httpcore": _httpcore, "aiohttp": _aiohttp}

# ----------------------------------------------------------------------------- measuring


def request_body(size: int) -> bytes:
    """A Responses request body of about ``size`` bytes (one long user message)."""
    message: dict[str, Any] = {"type": "message", "role": "user"}
    head = {"model": "cheap", "stream": True, "input": [message]}
    base = len(orjson.dumps(head)) + len(',"content":""')
    message["content"] = "x" * max(0, size - base)
    return orjson.dumps(head)


HEADERS: Final = [
    (b"content-type", b"application/json"),
    (b"accept", b"text/event-stream"),
    (b"authorization", b"Bearer sk-benchmark"),
    (b"user-agent", b"OpenAI/Python 2.20.0"),
    (b"x-stainless-lang", b"python"),
    (b"openai-beta", b"responses_websockets=2026-02-06"),
    (b"accept-encoding", b"identity"),
]
"""About what a turn carries up: the handshake's end-to-end headers plus the proxy's own."""


async def _batch(request: Request, url: str, body: bytes, count: int) -> list[tuple[float, float]]:
    """``count`` requests one after the other: each one's (thread CPU, wall) seconds."""
    samples = []
    for _ in range(count):
        cpu, wall = time.thread_time(), time.perf_counter()
        read = await request(url, HEADERS, body)
        samples.append((time.thread_time() - cpu, time.perf_counter() - wall))
        if read <= 0:
            raise RuntimeError("the upstream answered nothing")
    return samples


async def measure(
    url: str, clients: Sequence[str], repeat: int, requests: int
) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Every client and size, interleaved ``repeat`` times: the samples per (client, size)."""
    made = {name: await FACTORIES[name]() for name in clients}
    bodies = {size: request_body(size) for size in SIZES}
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for name in clients:  # connect and warm up, unmeasured
            for body in bodies.values():
                await _batch(made[name][0], url, body, 3)
        for rep in range(repeat):
            order = [*clients[rep % len(clients) :], *clients[: rep % len(clients)]]
            print(f"http_clients: repetition {rep + 1}/{repeat}", file=sys.stderr)
            for size, body in bodies.items():
                for name in order:
                    gc.collect()
                    batch = await _batch(made[name][0], url, body, requests)
                    samples.setdefault((name, size), []).extend(batch)
    finally:
        for _, close in made.values():
            await close()
    return samples


def report(
    samples: dict[tuple[str, int], list[tuple[float, float]]], clients: Sequence[str]
) -> str:
    """The table: per size and client, median CPU and wall per request, and ratios to the
    first client's."""
    lines = [
        f"  {'body':>9}  {'client':<9} {'CPU/request':>12} {'/' + clients[0]:>8} "
        f"{'wall/request':>13} {'/' + clients[0]:>8}",
        "  " + "-" * 66,
    ]
    for size in SIZES:
        base_cpu = median(cpu for cpu, _ in samples[(clients[0], size)])
        base_wall = median(wall for _, wall in samples[(clients[0], size)])
        for name in clients:
            cpu = median(c for c, _ in samples[(name, size)])
            wall = median(w for _, w in samples[(name, size)])
            lines.append(
                f"  {format_bytes(size):>9}  {name:<9} {format_seconds(cpu):>12} "
                f"{cpu / base_cpu:>8.2f} {format_seconds(wall):>13} {wall / base_wall:>8.2f}"
            )
    return "\n".join(lines)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (as under uvicorn), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the clients; print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve" in argv:
        serve_child(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=7, help="interleaved repetitions (7)")
    parser.add_argument("--requests", type=int, default=20, help="requests per batch (20)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="which, in order")
    arguments = parser.parse_args(argv)
    clients = [name.strip() for name in arguments.clients.split(",") if name.strip()]
    with cheap_upstream() as upstream, asyncio.Runner(loop_factory=loop_factory()) as runner:
        samples = runner.run(
            measure(upstream.base_url + PATH, clients, arguments.repeat, arguments.requests)
        )
    print(
        f"Upstream clients: POST {PATH} to a cheap upstream in another process on loopback "
        f"(8 SSE events answered, one chunk each), keep-alive; median of "
        f"{arguments.repeat} x {arguments.requests} requests, interleaved; CPU = this "
        f"process's event-loop thread."
    )
    print(report(samples, clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
