"""The access log: one line per turn and one per closed connection, on the ``ws_mode.access``
logger at INFO, in the style of uvicorn's access log (``uvicorn.access``); here each line is
cut in two::

    127.0.0.1:52624 - "response.create /v1/responses" completed 41.2ms conn=3f9a1c2e
        lane=- id=resp_0a1b previous=- cache=- in=312 out=5120 tokens_in=1830 tokens_out=96
        cached=0.00 code=-
    127.0.0.1:52624 - "WebSocket /v1/responses" 1000 8.214s conn=3f9a1c2e by=client turns=5
        in=1560 out=25600 reason=-

As uvicorn does, the lines are written by default (`WebSocketModeMiddleware(access_log=False)`
turns them off, as ``uvicorn --no-access-log``) and the library adds no handler: they reach
whatever the application configured for ``ws_mode.access`` (or its parents), and nothing is
built while that logger is not enabled for INFO (Python's default: WARNING). Each record also
carries the line's values as attributes (``record.connection_id``, ``record.status``, ...), for
a structured (JSON) formatter. A value a client sent (its address too: behind a proxy it is
what ``X-Forwarded-For`` said) is written as it is when it is a plain token (``resp_1``,
``lane-2``), else quoted and escaped (`ws_mode._logs.for_log`); on the record each string is
cut to the same bound but not escaped (`ws_mode._logs.cut_strings`: the formatter encodes
it), so a record held by a queued or buffering handler holds no more of a client's values
than the line. The fields are described in docs/operations.md, "Access log".
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, Final

from ._logs import _UntilConfigured, cut_strings, for_log

if TYPE_CHECKING:
    from ._records import ConnectionRecord, TurnRecord

ACCESS_LOGGER: Final = "ws_mode.access"
logger = logging.getLogger(ACCESS_LOGGER)

_TURN_LINE: Final = (
    '%s - "response.create %s" %s %.1fms conn=%s lane=%s id=%s previous=%s cache=%s '
    "in=%d out=%d tokens_in=%s tokens_out=%s cached=%s code=%s"
)
_CONNECTION_LINE: Final = (
    '%s - "WebSocket %s" %s %.3fs conn=%s by=%s turns=%d in=%d out=%d reason=%s'
)
_PLAIN: Final = re.compile(r"[\w.:/@+-]{1,128}", re.ASCII)


def _value(value: str | None) -> str:
    """A value as it goes in a line: ``-`` for none, a plain token as it is, anything else
    quoted and escaped, its spaces too (``'a\\x20b'``), so that no value can forge a field or
    a line."""
    if value is None:
        return "-"
    return value if _PLAIN.fullmatch(value) else for_log(value).replace(" ", "\\x20")


def _last(value: str | None) -> str:
    """The line's last value (a close's reason): as `_value`, its spaces kept."""
    if value is None:
        return "-"
    return value if _PLAIN.fullmatch(value) else for_log(value)


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
        _value(connection.client),
        connection.path,
        record.status,
        duration_ms,
        connection.id,
        _value(record.stream_id),
        _value(record.response_id),
        _value(record.previous_response_id),
        record.cache or "-",
        record.bytes_in,
        record.bytes_out,
        usage.input_tokens if usage is not None else "-",
        usage.output_tokens if usage is not None else "-",
        f"{ratio:.2f}" if ratio is not None else "-",
        _value(record.error_code),
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
        _value(record.client),
        record.path,
        record.close_code,
        record.duration,
        record.id,
        record.closed_by,
        record.turns,
        record.bytes_in,
        record.bytes_out,
        _last(record.close_reason),
        extra=cut_strings(
            {
                "client_addr": record.client,
                "connection_id": record.id,
                "close_code": record.close_code,
                "close_reason": record.close_reason,
                "closed_by": record.closed_by,
                "turns": record.turns,
                "duration_ms": round(record.duration * 1000, 3),
                "bytes_in": record.bytes_in,
                "bytes_out": record.bytes_out,
            }
        ),
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
