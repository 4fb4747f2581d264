"""What a turn and a connection did, as records filled in while they run: the access log
(`ws_mode._access_log`) and the spans (`ws_mode._tracing`) report them once they end, as
`ws_mode._observe.Observer` tells them to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._tap import Usage
    from ._tracing import ConnectionSpan, TurnSpan

#: The `close_code` of a connection that ended without a close frame (RFC 6455 §7.4.1).
ABNORMAL_CLOSURE = 1006


@dataclass(slots=True, eq=False)
class ConnectionRecord:
    """One accepted connection, as the access log and its span report it."""

    #: A short random id, on the connection's line and on each of its turns' lines.
    id: str
    #: The client's address as the ASGI scope gives it (``host:port``; ``host`` alone when the
    #: server knows no port, as behind a proxy whose ``X-Forwarded-For`` it honours), or None.
    client: str | None
    path: str
    #: When it was accepted (`time.perf_counter()`).
    started: float
    span: ConnectionSpan | None = None
    #: The turns it served (warm-ups and successors included).
    turns: int = 0
    #: The creates refused before they ran (a bad field, a bound of the lanes, a drain): not
    #: among its `turns`.
    refused: int = 0
    #: The text frames received and sent, in characters (bytes, for ASCII JSON).
    bytes_in: int = 0
    bytes_out: int = 0
    #: The close frame's code and reason, and who sent it first (``client`` or ``server``).
    close_code: int | None = None
    close_reason: str | None = None
    closed_by: str | None = None
    duration: float = 0.0

    def closed(self, code: int, reason: str | None, by: str) -> None:
        """Note the close, unless one was noted already (the first one is the close)."""
        if self.close_code is None:
            self.close_code, self.close_reason, self.closed_by = code, reason or None, by


@dataclass(slots=True, eq=False)
class TurnRecord:
    """One `response.create` served (a generated response, or a warm-up), as the access log
    and its span report it."""

    connection: ConnectionRecord
    stream_id: str | None
    previous_response_id: str | None
    #: The length of the create's frame (0 for a successor steering input calls for).
    bytes_in: int
    started: float
    span: TurnSpan | None = None
    response_id: str | None = None
    #: Where `previous_response_id` was found: ``hit`` (the connection's cache), ``store``
    #: (hydrated from the store), ``forwarded`` (to the handler, `on_cache_miss="forward"`),
    #: ``miss`` (nowhere); None without a `previous_response_id`.
    cache: str | None = None
    warm_up: bool = False
    #: The response was cut at an output item for steering input.
    steered: bool = False
    #: The client interrupted the response (`response.interrupt`).
    interrupted: bool = False
    #: ``completed`` / ``incomplete`` (the response's status), ``failed`` (a failed response
    #: or an error event, `error_code` says which), or ``abandoned`` (the client left, or the
    #: connection closed, before the response ended).
    status: str = "abandoned"
    error_code: str | None = None
    bytes_out: int = 0
    duration: float = 0.0
    #: The model its response object names (the handler's or its upstream's word, which may
    #: differ from the request's), and the tokens the response's terminal event reports in
    #: its `usage` (None: it reported none, or no response ended).
    model: str | None = None
    usage: Usage | None = None

    def failed(self, code: str | None) -> None:
        """The turn ended with an error (`code`: its error code)."""
        self.status = "failed"
        self.error_code = code or "response_failed"
