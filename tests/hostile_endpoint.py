"""A hostile WebSocket endpoint on loopback: a real ``websockets`` server that accepts any socket
and answers each message with one text frame of exactly ``size`` bytes, a ``response.completed``
event padded with a field no client asked for; or, flooding, with ``response.output_text.delta``
events of ``size`` bytes, one after the other until the client goes. The clients' limits are
tested against it (``ws_mode.testing._client``, ``ws-mode check``).

The single answer is a terminal event, so a client without a limit reads it whole and goes on at
once (no turn waits for a timeout); a client with a smaller limit refuses it at its frame
header. The flood never ends a turn: only a bound on what the client reads stops it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import orjson
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve


def padded(event: dict[str, Any], field: str, size: int) -> str:
    """``event`` as JSON text of exactly ``size`` bytes (or as small as it can be), ``field``
    holding the padding."""
    bare = len(orjson.dumps({**event, field: ""}))
    return orjson.dumps({**event, field: "x" * max(0, size - bare)}).decode()


def oversized_answer(size: int) -> str:
    """A ``response.completed`` event of exactly ``size`` bytes."""
    response = {"id": "resp_hostile", "object": "response", "status": "completed"}
    return padded({"type": "response.completed", "response": response}, "padding", size)


@contextlib.contextmanager
def hostile_endpoint(size: int, *, flood: bool = False) -> Iterator[str]:
    """Serve the endpoint in a thread; yields its base URL (``http://127.0.0.1:PORT``)."""
    answer = oversized_answer(size)
    delta = padded({"type": "response.output_text.delta", "stream_id": None}, "delta", size)

    def handler(connection: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            for _message in connection:
                if not flood:
                    connection.send(answer)
                    continue
                while True:  # until the client closes the socket
                    connection.send(delta)

    # The requests the clients send are small: websockets' default 1 MiB limit holds them.
    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.shutdown()
            thread.join(10)
