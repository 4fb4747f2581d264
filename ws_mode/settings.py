"""The settings every connection of one middleware shares, checked once when it is built."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .asgi import ASGIApp
from .auth import Authenticator
from .budget import MemoryBudget
from .limits import Limits
from .stats import Stats
from .store import ResponseStore
from .tokens import Renderer
from .turn import Turn

__all__ = ["CacheMiss", "FullContext", "ResponseHook", "Settings"]

FullContext = Literal["always", "on_miss"]
CacheMiss = Literal["error", "forward"]

#: Called after each finished response with its Turn and the terminal response object, off the
#: path of the next turn (accounting, logging). May be a coroutine function.
ResponseHook = Callable[[Turn, dict[str, Any]], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Settings:
    """What every connection of one middleware shares; checked once, in its `__init__`."""

    app: ASGIApp
    path: str
    handler_path: str
    full_context: FullContext
    limits: Limits
    renderer: Renderer | None = None
    on_response: ResponseHook | None = None
    on_cache_miss: CacheMiss = "error"
    subprotocols: tuple[str, ...] = ()
    authenticate: Authenticator | None = None
    reauthenticate_seconds: float | None = None
    store: ResponseStore | None = None
    #: Whether `response.steer` is served (`ws_mode.steering`); False answers
    #: `steering_not_supported`.
    steering: bool = True
    stats: Stats = field(default_factory=Stats)
    #: This middleware's view of the process's memory budget (`Limits.max_memory_bytes`).
    budget: MemoryBudget = field(default_factory=lambda: MemoryBudget(Limits().max_memory_bytes))
