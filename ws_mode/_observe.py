"""What each turn and each connection did, told once it ends: a line of the access log
(`ws_mode._access_log`) and a span (`ws_mode._tracing`).

A record is filled in as the work goes from what the connection and the turn runner know
anyway; the only per-event work is counting the bytes of the frames sent. One `Observer` per
middleware says where the records go: its tracing (None: no span, and nothing done for one)
and whether its access log is on.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from . import _access_log as access_log
from ._asgi import Scope
from ._records import ABNORMAL_CLOSURE, ConnectionRecord, TurnRecord
from ._tracing import Tracing


class Observer:
    """Where one middleware's records go: spans (`tracing`; None: none) and the access log
    (`access_log`: whether its lines are written, at INFO on ``ws_mode.access``)."""

    __slots__ = ("access_log", "tracing")

    def __init__(self, *, tracing: Tracing | None = None, access_log: bool = True) -> None:
        self.tracing = tracing
        self.access_log = access_log

    def connection_record(self, scope: Scope, path: str) -> ConnectionRecord:
        """The record of a connection about to be served."""
        return ConnectionRecord(
            id=secrets.token_hex(4),
            client=client_address(scope),
            path=path,
            started=time.perf_counter(),
        )

    def connection_opened(self, record: ConnectionRecord, scope: Scope) -> None:
        """The connection is accepted: its span starts, current in the task serving it."""
        record.started = time.perf_counter()
        if self.tracing is not None:
            record.span = self.tracing.connection(scope, record.path, record.id)
            if record.span is not None:
                record.span.attach()

    def connection_closed(self, record: ConnectionRecord) -> None:
        """The connection ended: its line, and its span ends."""
        record.duration = time.perf_counter() - record.started
        if record.close_code is None:
            record.closed(ABNORMAL_CLOSURE, None, "client")
        if record.span is not None:
            record.span.end(_connection_attributes(record))
        if self.access_log:
            access_log.connection_line(record)

    def turn_started(
        self,
        connection: ConnectionRecord,
        *,
        stream_id: str | None,
        previous_response_id: str | None,
        model: object,
        bytes_in: int,
    ) -> TurnRecord:
        """The record of a turn starting now; its span is current until `turn_ended`."""
        record = TurnRecord(
            connection, stream_id, previous_response_id, bytes_in, time.perf_counter()
        )
        if connection.span is not None:
            record.span = connection.span.turn(
                stream_id=stream_id,
                previous_response_id=previous_response_id,
                model=model if isinstance(model, str) else None,
            )
        return record

    def turn_ended(self, record: TurnRecord, *, refused: bool = False) -> None:
        """The turn ended: its line, and its span ends. A create `refused` before it ran
        counts among its connection's refused creates, not its turns."""
        record.duration = time.perf_counter() - record.started
        connection = record.connection
        if refused:
            connection.refused += 1
        else:
            connection.turns += 1
        if record.span is not None:
            record.span.end(_turn_attributes(record), record.error_code)
        if self.access_log:
            access_log.turn_line(record)

    def drain_began(
        self, path: str, *, sockets: int, turns: int, upgrades: int, grace: float
    ) -> None:
        """A drain begins: its line (`ws_mode._access_log.drain_began_line`)."""
        if self.access_log:
            access_log.drain_began_line(path, sockets, turns, upgrades, grace)

    def drain_ended(
        self, path: str, *, duration: float, sockets: int, finished: int, cut: int
    ) -> None:
        """A drain ended: its line (`ws_mode._access_log.drain_ended_line`)."""
        if self.access_log:
            access_log.drain_ended_line(path, duration, sockets, finished, cut)


def client_address(scope: Scope) -> str | None:
    """The client's address as the ASGI scope gives it: ``host:port``, ``[v6]:port``, or the
    host alone when the port is unknown (0 or missing: what a server honouring a proxy's
    ``X-Forwarded-For`` gives); None without one. The server's proxy-headers handling decides
    which address that is; ws_mode reads no forwarding header itself."""
    client = scope.get("client")
    if not client:
        return None
    host, port = str(client[0]), client[1] if len(client) > 1 else None
    if not port:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _turn_attributes(record: TurnRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "ws_mode.response.status": record.status,
        "ws_mode.bytes_in": record.bytes_in,
        "ws_mode.bytes_out": record.bytes_out,
    }
    if record.response_id is not None:
        attributes["gen_ai.response.id"] = record.response_id
    if record.model is not None:
        attributes["gen_ai.response.model"] = record.model
    usage = record.usage
    if usage is not None:
        # OpenTelemetry's GenAI names: the cached and reasoning counts are parts of the input
        # and output counts, as in the Responses API's `usage`.
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
        ratio = usage.cache_ratio
        if ratio is not None:  # did the turn find its prefix in the replica's cache?
            attributes["ws_mode.prompt_cache_ratio"] = ratio
    if record.cache is not None:
        attributes["ws_mode.cache.hit"] = record.cache == "hit"
        attributes["ws_mode.store.hydrated"] = record.cache == "store"
        if record.cache == "forwarded":
            attributes["ws_mode.previous_response.forwarded"] = True
    if record.warm_up:
        attributes["ws_mode.warm_up"] = True
    if record.steered:
        attributes["ws_mode.steered"] = True
    if record.interrupted:
        attributes["ws_mode.interrupted"] = True
    if record.error_code is not None:
        attributes["error.type"] = record.error_code
    return attributes


def _connection_attributes(record: ConnectionRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "ws_mode.turns": record.turns,
        "ws_mode.turns_refused": record.refused,
        "ws_mode.bytes_in": record.bytes_in,
        "ws_mode.bytes_out": record.bytes_out,
        "ws_mode.close.code": record.close_code,
        "ws_mode.close.by": record.closed_by,
    }
    if record.close_reason:
        attributes["ws_mode.close.reason"] = record.close_reason
    return attributes
