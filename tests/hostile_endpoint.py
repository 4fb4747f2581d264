"""A hostile WebSocket endpoint on loopback: a real ``websockets`` server that accepts any socket
and answers each message with one text frame of about ``size`` bytes, a ``response.completed``
event padded with a field no client asked for. The clients' message limit is tested against it
(``ws_mode.testing._client``, ``ws-mode check``).

The answer is a terminal event, so a client without a limit reads it whole and goes on at once
(no turn waits for a timeout); a client with a smaller limit refuses it at its frame header.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import orjson
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve


def oversized_answer(size: int) -> str:
    """A ``response.completed`` event of exactly ``size`` bytes (or as small as it can be)."""
    event = {
        "type": "response.completed",
        "response": {"id": "resp_hostile", "object": "response", "status": "completed"},
        "padding": "",
    }
    bare = len(orjson.dumps(event))
    event["padding"] = "x" * max(0, size - bare)
    return orjson.dumps(event).decode()


@contextlib.contextmanager
def hostile_endpoint(size: int) -> Iterator[str]:
    """Serve the endpoint in a thread; yields its base URL (``http://127.0.0.1:PORT``)."""
    answer = oversized_answer(size)

    def handler(connection: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            for _message in connection:
                connection.send(answer)

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
