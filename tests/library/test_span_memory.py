"""What spans hold of a client's values, measured as RSS while the collector is down.

An OpenTelemetry SDK keeps every span until its exporter delivers it: `BatchSpanProcessor`
queues up to 2,048 of them (and holds the batch being exported) while the collector does not
answer, and that memory is outside ws_mode's budget. A real uvicorn server runs in a child
process (so only its own memory counts) with the real SDK, whose exporter never gets an answer
(each export waits until the process ends, as one to a collector that is down waits out its
timeouts and retries). A real `websockets` client (permessage-deflate: a 1 MiB model name is a
few KiB on the wire) serves turns whose `model` is about 1 MiB: each turn's span must keep a
few hundred characters of it, not the megabyte, so the worker's RSS after the turns ended
stays within the rule of docs/limits.md: 1.5 x `max_memory_bytes` plus the per-socket
overhead per socket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.rss_server import RSS, SERVE, MiB, child_server, wait_for
from ws_mode._budget import CONNECTION_COST

BUDGET = 32 * MiB  # a 1 MiB frame reserves 16 MiB while it is parsed (`_budget.PARSE_FACTOR`)
TURNS = 200
SOCKETS = 1
#: Under 1 MiB, so each frame is parsed in the worker (`_frames.OFF_LOOP_BYTES`), not in a
#: helper process whose memory would not show in the worker's RSS.
MODEL_CHARS = MiB - 4096

SERVER = (
    RSS
    + """
import os, sys, threading
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread

class Unreachable(SpanExporter):
    # A collector that never answers: each export waits until the process ends.
    def export(self, spans):
        threading.Event().wait()

    def shutdown(self):
        pass

async def stats(request):
    return JSONResponse({"rss": rss(), **middleware.stats.snapshot()})

async def handler(request):
    await request.body()
    return JSONResponse({"id": "resp_" + os.urandom(16).hex(), "object": "response",
                         "status": "completed", "model": "m", "output": []})

provider = TracerProvider(shutdown_on_exit=False)  # its exporter never returns
provider.add_span_processor(BatchSpanProcessor(Unreachable()))
app = Starlette(routes=[Route("/stats", stats), Route("/v1/responses", handler, methods=["POST"])])
middleware = WebSocketModeMiddleware(
    app, limits=Limits(max_memory_bytes=int(sys.argv[1])), tracer_provider=provider
)

class Serving(ServerThread):
    # Once the test is done, the process ends at once: the exporter's thread never ends, and
    # stopping the server would wait on it (the drain's flush runs in the loop's default
    # executor, which the loop waits for when it closes) until the thread join's 15 s ran out.
    def __exit__(self, *exc_info):
        os._exit(0)

ServerThread = Serving
"""
    + SERVE
)


@pytest.fixture
def server() -> Iterator[str]:
    with child_server(SERVER, str(BUDGET)) as base_url:
        yield base_url


def _turns(url: str, count: int, model: str) -> None:
    """`count` turns on one socket, each answered completed; the socket then closes."""
    frame = json.dumps({"type": "response.create", "model": model, "input": "hi"})
    with connect(url, max_size=None) as socket:
        extensions = socket.response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in extensions
        for _ in range(count):
            socket.send(frame)
            while True:
                event = json.loads(socket.recv(timeout=30))
                if event["type"] in ("response.completed", "error"):
                    break
            assert event["type"] == "response.completed", event


def _closed(base_url: str) -> dict[str, Any]:
    """The server's stats once no socket is open (its span has ended)."""
    return wait_for(base_url, lambda reported: reported["connections_open"] == 0)


def test_spans_queued_for_a_collector_that_is_down_keep_no_client_megabytes(server: str) -> None:
    url = server.replace("http", "ws", 1) + "/v1/responses"
    model = "m" * MODEL_CHARS
    _turns(url, 3, model)  # the code paths and the allocator warm, so the baseline holds them
    before = _closed(server)["rss"]
    _turns(url, TURNS, model)
    after = _closed(server)
    growth = after["rss"] - before
    allowed = 1.5 * BUDGET + CONNECTION_COST * SOCKETS
    # Spans kept whole held TURNS x 1 MiB (about 200 MiB) after every turn had ended.
    assert growth < allowed, f"RSS grew {growth / MiB:.1f} MiB, allowed {allowed / MiB:.1f} MiB"
    assert after["turns"] == TURNS + 3
    assert after["memory_bytes"] == 0
