"""The access log: one line per turn and one per closed connection, on the ``ws_mode.access``
logger at INFO, in the style of uvicorn's access log (``uvicorn.access``); here each line is
cut in two::

    127.0.0.1:52624 - "response.create /v1/responses" completed 41.2ms conn=3f9a1c2e
        lane=- id=resp_0a1b previous=- cache=- in=312 out=5120 tokens_in=1830 tokens_out=96
        cached=0.00 code=-
    127.0.0.1:52624 - "WebSocket /v1/responses" 1001 8.214s conn=3f9a1c2e by=server turns=5
        refused=0 in=1560 out=25600 reason="server shutting down"

As uvicorn does, the lines are written by default (`WebSocketModeMiddleware(access_log=False)`
turns them off, as ``uvicorn --no-access-log``) and the library adds no handler: they reach
whatever the application configured for ``ws_mode.access`` (or its parents), and nothing is
built while that logger is not enabled for INFO (Python's default: WARNING). Each record also
carries the line's values as attributes (``record.connection_id``, ``record.status``, ...), for
a structured (JSON) formatter. A value a client sent (its address too: behind a proxy it is
the server's proxy-headers handling took from ``X-Forwarded-For``), like every value of a
line, is written as logfmt writes it: as it is when it is a plain token (``resp_1``,
``lane-2``), else in double quotes, escaped (`ws_mode._logs.for_logfmt`), so a logfmt reader
reads each field as written and no value forges one; on the record each string is cut to the
same bound but not escaped (`ws_mode._logs.cut_strings`: the formatter encodes it), so a record
held by a queued or buffering handler holds no more of a client's values than the line.

A drain writes two lines of its own, when it begins (the sockets, the turns running and the
upgrades not yet accepted it deals with) and when it ends (how long it took, how many of those
turns finished and how many the grace cut)::

    drain began path=/v1/responses sockets=2 turns=1 upgrades=0 grace=30.000s
    drain ended path=/v1/responses duration=0.412s sockets=2 turns_finished=1 turns_cut=0

The fields are described in docs/operations.md, "Access log".
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Final

from ._logs import _UntilConfigured, cut_strings, for_logfmt

if TYPE_CHECKING:
    from ._records import ConnectionRecord, TurnRecord

ACCESS_LOGGER: Final = "ws_mode.access"
logger = logging.getLogger(ACCESS_LOGGER)

_TURN_LINE: Final = (
    '%s - "response.create %s" %s %.1fms conn=%s lane=%s id=%s previous=%s cache=%s '
    "in=%d out=%d tokens_in=%s tokens_out=%s cached=%s code=%s"
)
_CONNECTION_LINE: Final = (
    '%s - "WebSocket %s" %s %.3fs conn=%s by=%s turns=%d refused=%d in=%d out=%d reason=%s'
)
_DRAIN_BEGAN_LINE: Final = "drain began path=%s sockets=%d turns=%d upgrades=%d grace=%.3fs"
_DRAIN_ENDED_LINE: Final = (
    "drain ended path=%s duration=%.3fs sockets=%d turns_finished=%d turns_cut=%d"
)


def turn_line(record: TurnRecord) -> None:
    """Write the line of a turn that ended (when ``ws_mode.access`` is enabled for INFO)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    connection = record.connection
    duration_ms = record.duration * 1000
    usage = record.usage
    ratio = usage.cache_ratio if usage is not None else None
    logger.info(
        _TURN_LINE,
        for_logfmt(connection.client),
        connection.path,
        record.status,
        duration_ms,
        connection.id,
        for_logfmt(record.stream_id),
        for_logfmt(record.response_id),
        for_logfmt(record.previous_response_id),
        record.cache or "-",
        record.bytes_in,
        record.bytes_out,
        usage.input_tokens if usage is not None else "-",
        usage.output_tokens if usage is not None else "-",
        f"{ratio:.2f}" if ratio is not None else "-",
        for_logfmt(record.error_code),
        extra=cut_strings(
            {
                "client_addr": connection.client,
                "connection_id": connection.id,
                "stream_id": record.stream_id,
                "response_id": record.response_id,
                "previous_response_id": record.previous_response_id,
                "status": record.status,
                "error_code": record.error_code,
                "cache": record.cache,
                "warm_up": record.warm_up,
                "duration_ms": round(duration_ms, 3),
                "bytes_in": record.bytes_in,
                "bytes_out": record.bytes_out,
                "model": record.model,
                "input_tokens": usage.input_tokens if usage is not None else None,
                "cached_input_tokens": usage.cached_tokens if usage is not None else None,
                "output_tokens": usage.output_tokens if usage is not None else None,
                "reasoning_tokens": usage.reasoning_tokens if usage is not None else None,
                "prompt_cache_ratio": ratio,
            }
        ),
    )


def connection_line(record: ConnectionRecord) -> None:
    """Write the line of a connection that closed (when ``ws_mode.access`` is enabled for
    INFO)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        _CONNECTION_LINE,
        for_logfmt(record.client),
        record.path,
        record.close_code,
        record.duration,
        record.id,
        record.closed_by,
        record.turns,
        record.refused,
        record.bytes_in,
        record.bytes_out,
        for_logfmt(record.close_reason),
        extra=cut_strings(
            {
                "client_addr": record.client,
                "connection_id": record.id,
                "close_code": record.close_code,
                "close_reason": record.close_reason,
                "closed_by": record.closed_by,
                "turns": record.turns,
                "refused": record.refused,
                "duration_ms": round(record.duration * 1000, 3),
                "bytes_in": record.bytes_in,
                "bytes_out": record.bytes_out,
            }
        ),
    )


def drain_began_line(path: str, sockets: int, turns: int, upgrades: int, grace: float) -> None:
    """Write the line of a drain beginning: the `sockets` open, the `turns` running on them,
    which it gives up to `grace` seconds, and the `upgrades` not yet accepted, which it
    refuses."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        _DRAIN_BEGAN_LINE,
        for_logfmt(path),
        sockets,
        turns,
        upgrades,
        grace,
        extra={
            "drain": "began",
            "path": path,
            "sockets": sockets,
            "turns": turns,
            "upgrades": upgrades,
            "grace_seconds": grace,
        },
    )


def drain_ended_line(path: str, duration: float, sockets: int, finished: int, cut: int) -> None:
    """Write the line of a drain that ended after `duration` seconds: of the turns running
    when it began on its `sockets`, `finished` ended by themselves, `cut` were still running
    when the grace ran out."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info(
        _DRAIN_ENDED_LINE,
        for_logfmt(path),
        duration,
        sockets,
        finished,
        cut,
        extra={
            "drain": "ended",
            "path": path,
            "duration_ms": round(duration * 1000, 3),
            "sockets": sockets,
            "turns_finished": finished,
            "turns_cut": cut,
        },
    )


def show_access_log(level: int = logging.INFO) -> None:
    """Print the access log on stdout in uvicorn's style (``INFO:     127.0.0.1:52624 - ...``)
    while the application has configured no logging of its own, and set the logger's `level`
    (above INFO: no line) unless it has one; once per process. For programs (the ``ws-mode``
    command line), not for libraries."""
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
    if any(isinstance(handler, _UntilConfigured) for handler in logger.handlers):
        return
    handler = _UntilConfigured(sys.stdout)
    handler.setFormatter(_UvicornStyle())
    logger.addHandler(handler)


class _UvicornStyle(logging.Formatter):
    """``INFO:     message``: the level as uvicorn prints its access lines."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}:"
        return f"{level:<9} {super().format(record)}"
