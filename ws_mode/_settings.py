"""The settings every connection of one middleware shares, checked once when it is built."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._asgi import ASGIApp, Scope
from ._auth import Authenticator, PrincipalKey
from ._budget import MemoryBudget
from ._conversation import ConversationKeys
from ._errors import ConfigError
from ._hooks import guarded_renderer
from ._limits import Limits
from ._observe import Observer
from ._stats import Stats
from ._store import ResponseStore
from ._tokens import Renderer
from ._turn import Turn

logger = logging.getLogger(__name__)

FullContext = Literal["always", "on_miss"]
CacheMiss = Literal["error", "forward"]

#: Called after each finished response with its Turn and the terminal response object, off the
#: path of the next turn (accounting, logging); `Turn.usage` holds the response's tokens as the
#: metrics count them. May be a coroutine function.
ResponseHook = Callable[[Turn, dict[str, Any]], Awaitable[None] | None]

#: `handshake_headers(scope, principal)`: the headers of the handshake's answer (a mapping of
#: names to values, `(name, value)` pairs, or None), from the socket's scope and the principal
#: `authenticate` returned (None without it). May be a coroutine function.
HeaderValues = Mapping[str, str] | Mapping[bytes, bytes] | Iterable[tuple[str | bytes, str | bytes]]
HandshakeHeaders = Callable[[Scope, Any], Awaitable[HeaderValues | None] | HeaderValues | None]


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
    #: Maps the `authenticate` hook's principal to its stable key (`ws_mode._auth.principal_key`).
    principal_key: PrincipalKey | None = None
    #: Every caller shares one store scope (no `authenticate` hook: the operator opted in).
    shared_store: bool = False
    #: Whether `response.steer` is served (`ws_mode._steering`); False answers
    #: `steering_not_supported`.
    steering: bool = True
    #: Whether `response.interrupt` is served (`ws_mode._turn_runner`); False answers
    #: `response.interrupt.failed` with `interrupt_not_supported`, and the response runs on.
    interrupts: bool = True
    #: Sets headers on the handshake's answer (`websocket.accept`).
    handshake_headers: HandshakeHeaders | None = None
    stats: Stats = field(default_factory=Stats)
    #: This middleware's view of the process's memory budget (`Limits.max_memory_bytes`).
    budget: MemoryBudget = field(default_factory=lambda: MemoryBudget(Limits().max_memory_bytes))
    #: The conversation keys: their secret, the headers they go in (`ws_mode._conversation`).
    conversations: ConversationKeys = field(default_factory=ConversationKeys)
    #: Where each connection's and turn's record goes: spans (`tracer_provider`) and the access
    #: log (`access_log`) (`ws_mode._observe`).
    observer: Observer = field(default_factory=Observer)

    def __post_init__(self) -> None:
        # Whatever the renderer raises, wherever ws_mode calls it, is raised as the
        # renderer's (`HookFailed`), so the turn it fails names it.
        if self.renderer is not None:
            object.__setattr__(self, "renderer", guarded_renderer(self.renderer))


def check_principals(
    authenticate: Authenticator | None,
    reauthenticate_seconds: float | None,
    store: ResponseStore | None,
    principal_key: PrincipalKey | None,
    shared_store: bool,
) -> None:
    """Check the middleware's keywords about callers: `ConfigError` for a store that could not
    tell them apart, unless the operator opted into sharing it (`shared_store=True`, warned
    about once here)."""
    if reauthenticate_seconds is not None and (
        isinstance(reauthenticate_seconds, bool)
        or not isinstance(reauthenticate_seconds, int | float)
        or reauthenticate_seconds < 0
    ):
        raise ConfigError(
            "reauthenticate_seconds must be None or a number >= 0 (0: before every frame that "
            f"causes work), got {reauthenticate_seconds!r}."
        )
    if reauthenticate_seconds is not None and authenticate is None:
        raise ConfigError(
            f"reauthenticate_seconds={reauthenticate_seconds!r} runs the authenticate hook again "
            "on open sockets, and there is none: pass authenticate= (or drop "
            "reauthenticate_seconds)."
        )
    if not isinstance(shared_store, bool):
        raise ConfigError(f"shared_store must be True or False, got {shared_store!r}.")
    if principal_key is not None and (authenticate is None or not callable(principal_key)):
        raise ConfigError(
            "principal_key maps the authenticate hook's principal to a string key: it must be "
            f"callable and needs an authenticate hook; got {principal_key!r}."
        )
    if shared_store and store is None:
        raise ConfigError("shared_store=True shares a store's responses: it needs store=.")
    if shared_store and authenticate is not None:
        # Two opposite wishes: the hook's principals scope the store, or nothing does.
        raise ConfigError(
            "shared_store=True and an authenticate hook contradict each other: with the hook, "
            "stored responses are kept per principal. To let authenticated callers share them, "
            "drop shared_store and pass principal_key=lambda principal: 'shared'."
        )
    if store is not None and authenticate is None and not shared_store:
        raise ConfigError(
            "store= needs to know whose responses are whose: pass authenticate= (a hook that "
            "returns each caller's principal; stored responses are kept per principal), or "
            "shared_store=True if every caller may read and continue every stored response "
            "(a single tenant, or callers allowed to read each other's responses)."
        )
    if shared_store:
        logger.warning(
            "WebSocket mode's store is shared (shared_store=True): every caller may continue "
            "every stored response (with stateful_http, read and delete it too)"
        )
