"""The client's socket as a turn sees it: what the turn runner and a response's stream send on
(`ClientSocket`, which `ws_mode._connection.Connection` is) and `ClientGone`, raised when the
client left.

Both are the connection's concepts, but they live below it in the import order: the connection
imports the turn runner, which imports the handler call and the response stream, and those
send on the socket and raise and catch `ClientGone` (a handler that gives up once its sends
fail is no fault of its own).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class ClientGone(OSError):
    """The WebSocket client went away, stopped reading, or may no longer cause work (its
    credentials were refused): what was being done for it ends."""


class ClientSocket(Protocol):
    """One client's socket, as the turns on it use it."""

    async def send_text(self, text: str) -> None:
        """Send one frame; raise `ClientGone` when the client has left or stopped reading."""

    async def send_event(self, event: dict[str, Any]) -> None:
        """Encode and send one server event."""

    async def send_error(self, event: dict[str, Any]) -> None:
        """Send an error event of the connection's own (not a response's), counting it."""

    async def check_credentials(
        self, give_back: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Before work starts: run `authenticate` again when it is due; raise `ClientGone` when
        the credentials are refused (after awaiting `give_back()`, which returns to the client
        what the refused work held)."""
