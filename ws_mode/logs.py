"""How ws_mode's log lines reach an operator.

Every logger is under ``ws_mode`` (``ws_mode.connection``, ``ws_mode.handler_call``, ...), so
``logging.getLogger("ws_mode")`` filters them all. Two things happen when the first middleware
is made (:func:`install`):

- **Until the application configures logging**, warnings and errors print to stderr with their
  level and logger name, in uvicorn's style (``WARNING:  ws_mode.handler_call: ...``). Servers
  like uvicorn configure only their own loggers, and Python's last-resort output would show a
  bare message. As soon as the root logger has a handler (``logging.basicConfig``, Django's or
  your own ``dictConfig``), this output stops and the records go there instead.
- **uvicorn's line after a refusal.** uvicorn's ``websockets-sansio`` protocol logs
  ``ERROR: ASGI callable returned without completing handshake.`` after every upgrade refused
  with an HTTP answer (ws_mode's 426, 401, 403): the answer went out correctly, uvicorn forgets
  it did. That one line is dropped for the refusals ws_mode made, and only for those.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Final

__all__ = ["install", "refused_here"]

LOGGER: Final = "ws_mode"
_UVICORN_LINE: Final = "ASGI callable returned without completing handshake."
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("ws_mode_refused", default=False)


class _UntilConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints ws_mode's records while the root logger has no handler of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application's handlers print it (the record propagates to them)
        super().emit(record)


class _Format(logging.Formatter):
    """``WARNING:  ws_mode.handler_call: message``: the level as uvicorn prints its own."""

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}:"
        return f"{level:<9} {record.name}: {super().format(record)}"


class _RefusalLine(logging.Filter):
    """Drops uvicorn's incomplete-handshake error after a refusal ws_mode answered."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_refused.get() and record.getMessage() == _UVICORN_LINE)


_installed = False


def install() -> None:
    """Set up the two behaviours above, once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    handler = _UntilConfigured(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Format())
    logging.getLogger(LOGGER).addHandler(handler)
    logging.getLogger("uvicorn.error").addFilter(_RefusalLine())


def refused_here() -> None:
    """Note, in the refused connection's context, that ws_mode answered its upgrade."""
    _refused.set(True)
