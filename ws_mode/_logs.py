"""What ws_mode's log lines say, and where they go.

Every logger is under ``ws_mode`` (``ws_mode._connection``, ``ws_mode._handler_call``, ...), so
``logging.getLogger("ws_mode")`` filters them all.

**The library configures nothing.** Importing ws_mode or making a middleware adds no handler
and no filter to any logger: the records propagate to whatever the application configured
(``logging.basicConfig``, Django's ``LOGGING``, a ``dictConfig``). Until it configures
something, Python's last resort prints warnings and errors to stderr as bare messages. Two
helpers are for the programs that start a server on purpose:

- :func:`show_on_stderr`: ws_mode's warnings and errors on stderr with their level and logger,
  in uvicorn's style (``WARNING:  ws_mode._handler_call: ...``), until the root logger has a
  handler of its own. The ``ws-mode`` command line calls it.
- :class:`RefusalLineFilter`: uvicorn's ``websockets-sansio`` protocol logs
  ``ERROR: ASGI callable returned without completing handshake.`` after every upgrade refused
  with an HTTP answer (ws_mode's 426, 401, 403): the answer went out correctly, uvicorn forgets
  it did. The filter drops that one line for the refusals ws_mode made, and only for those.
  :func:`filter_uvicorn_refusals` installs it on ``uvicorn.error``; ``ws_mode.server.Server``
  and the command line do. Running uvicorn yourself, add it once at startup::

      logging.getLogger("uvicorn.error").addFilter(ws_mode._logs.RefusalLineFilter())

**Client values in log lines.** Anything a client sent (a ``previous_response_id``, an id in a
path, a handler body echoing its request) goes into a line through :func:`for_log`: control
characters escaped as ``repr`` does, so a newline cannot forge a second line, and cut to a
bound, so a 1 MiB id does not make a 1 MiB line. Where a value goes unescaped, as an attribute
of a log record (for a structured formatter) or of a span (for an exporter, which encodes it),
:func:`cut` bounds it: the same `LOG_VALUE_CHARS`, so a record or a span queued behind a slow
handler or a collector that is down holds a few hundred characters of each value, never what
the client sent.

**Values of key=value lines.** The access log's lines are logfmt fields (``conn=3f9a1c2e
previous=resp_1``): there a value goes through :func:`for_logfmt`, written as it is when it is
a plain token, else in double quotes with ``"`` and ``\\`` escaped by a backslash and every
character that is not printable escaped as ``repr`` does, so a logfmt reader reads one value
whatever it holds (a space, a quote, an ``=``, a newline), cut to the same bound.

**The application's failures.** When a hook of the application raises (`renderer`,
`authenticate`, ...), :func:`hook_raised` writes the one line an operator reads: the hook, the
exception and its traceback, and what became of the request.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
from typing import Any, Final

LOGGER: Final = "ws_mode"
#: How many characters of a client-sent value a log line (:func:`for_log`), a log record's
#: attribute or a span's attribute (:func:`cut`) keeps: an id is about 50, and ids longer than
#: this are refused on arrival (`ws_mode._protocol.MAX_ID_CHARS`, the same number).
LOG_VALUE_CHARS: Final = 256
_UVICORN_LINE: Final = "ASGI callable returned without completing handshake."
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("ws_mode_refused", default=False)


def for_log(value: object, limit: int = LOG_VALUE_CHARS) -> str:
    """`value` as it may go in a log line: a string quoted and escaped as ``repr`` writes it
    (``'resp_1\\nFAKE'``); bytes decoded as UTF-8 (undecodable ones replaced), then the same;
    an exception as ``ConnectionError: its message`` (some libraries' ``repr`` leaves the
    message out); anything else as its ``repr``; in those two, each character that is not
    printable escaped. At most `limit` characters (or bytes) of it, then ``... (N characters)``.

    The result is at most about ten times `limit` long (an escaped character takes up to ten)."""
    if isinstance(value, bytes | bytearray):
        size, unit = len(value), "bytes"
        text = bytes(value[:limit]).decode("utf-8", "replace")
    else:
        text = value if isinstance(value, str) else _text(value)
        size, unit = len(text), "characters"
        text = text[:limit]
    if isinstance(value, str | bytes | bytearray):
        escaped = repr(text)
    else:
        escaped = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return f"{escaped}... ({size} {unit})" if size > limit else escaped


#: A value a logfmt line takes as it is: no space, quote, ``=``, backslash or control character.
_PLAIN: Final = re.compile(r"[\w.:/@+-]{1,128}", re.ASCII)
_QUOTED: Final = str.maketrans({'"': '\\"', "\\": "\\\\"})


def for_logfmt(value: str | None, limit: int = LOG_VALUE_CHARS) -> str:
    """`value` as a logfmt line's value: ``-`` for None; a plain token (``resp_1``,
    ``lane-2``, ``127.0.0.1:5000``) as it is; anything else (``-`` itself too) in double
    quotes, ``"`` and ``\\`` escaped with a backslash, each character that is not printable
    escaped as ``repr`` writes it (``\\n``, ``\\x1b``), its first `limit` characters then
    ``... (N characters)`` inside the quotes. A logfmt reader reads it as one value: no value
    forges a field or a line."""
    if value is None:
        return "-"
    if value != "-" and _PLAIN.fullmatch(value):
        return value
    text = value[:limit]
    if text.isprintable():
        escaped = text.translate(_QUOTED)
    else:
        escaped = "".join(
            char.translate(_QUOTED) if char.isprintable() else repr(char)[1:-1] for char in text
        )
    if len(value) > limit:
        escaped += f"... ({len(value)} characters)"
    return f'"{escaped}"'


def cut(value: str, limit: int = LOG_VALUE_CHARS) -> str:
    """`value` as an attribute of a log record or of a span keeps it: whole up to `limit`
    characters, else its first `limit` and ``... (N characters)``, as :func:`for_log` ends a
    value it cut. Not escaped: the formatter or exporter that writes an attribute encodes it."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def cut_strings(attributes: dict[str, Any]) -> dict[str, Any]:
    """`attributes` with each string in it cut (:func:`cut`): what a log record or a span
    holds of them."""
    return {name: cut(value) if type(value) is str else value for name, value in attributes.items()}


def hook_raised(logger: logging.Logger, hook: str, exc: BaseException | None, then: str) -> None:
    """Log, once per failure, that the application's `hook` raised `exc`: one ERROR line on
    `logger` that names the hook and the exception (``renderer raised ValueError: ...``),
    says what became of the request (`then`), and carries the traceback. The exception's
    message goes through :func:`for_log` (it may quote what the client sent)."""
    said = for_log(exc) if exc is not None else "an exception"
    logger.error("%s raised %s; %s", hook, said, then, exc_info=exc)


def _text(value: object) -> str:
    if isinstance(value, BaseException):
        message = str(value)
        return f"{type(value).__name__}: {message}" if message else type(value).__name__
    return repr(value)


class _UntilConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints ws_mode's records while the root logger has no handler of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application's handlers print it (the record propagates to them)
        super().emit(record)


class _Format(logging.Formatter):
    """``WARNING:  ws_mode._handler_call: message``: the level as uvicorn prints its own."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}:"
        return f"{level:<9} {record.name}: {super().format(record)}"


class RefusalLineFilter(logging.Filter):
    """Drops uvicorn's ``ASGI callable returned without completing handshake.`` error after an
    upgrade ws_mode refused with an HTTP answer; every other record passes. Add it to the
    ``uvicorn.error`` logger (:func:`filter_uvicorn_refusals`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_refused.get() and record.getMessage() == _UVICORN_LINE)


def show_on_stderr() -> None:
    """Print ws_mode's warnings and errors to stderr in uvicorn's style while the application
    has configured no logging of its own; once per process. For programs (the ``ws-mode``
    command line), not for libraries."""
    ws_mode = logging.getLogger(LOGGER)
    if any(isinstance(handler, _UntilConfigured) for handler in ws_mode.handlers):
        return
    handler = _UntilConfigured(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Format())
    ws_mode.addHandler(handler)


def filter_uvicorn_refusals() -> None:
    """Add :class:`RefusalLineFilter` to ``uvicorn.error``, once per process."""
    uvicorn_error = logging.getLogger("uvicorn.error")
    if not any(isinstance(each, RefusalLineFilter) for each in uvicorn_error.filters):
        uvicorn_error.addFilter(RefusalLineFilter())


def refused_here() -> None:
    """Note, in the refused connection's context, that ws_mode answered its upgrade."""
    _refused.set(True)
