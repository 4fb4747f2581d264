"""The application around a middleware, read as it stands, never built here.

Two questions need the application's middleware stack. Which app a socket turn enters: the
whole application when a framework exposes it (Starlette and FastAPI put themselves in
`scope["app"]` before their middleware runs), so every HTTP middleware of that app, those added
outside ws_mode included, runs on a turn as on a plain `POST`. And where the WebSocket mode
middlewares are (`find_middlewares`). Starlette builds its middleware stack on the app's first
call and refuses `add_middleware` afterwards, so neither question builds it: the entry is looked
up in the stack the app built when it started, and a middleware that is only listed (the app
has not started) is made now and handed to Starlette when it builds the stack.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from ._asgi import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

T = TypeVar("T")


def entry(ws_scope: Scope, settings: object) -> ASGIApp | None:
    """The application a socket turn of the middleware whose settings are `settings` enters:
    the framework's app in `scope["app"]` when its built middleware stack holds that
    middleware; None when no framework exposes one that does (the turn calls the wrapped app).

    Only the chain of middlewares is followed, not routes: a middleware mounted as a route's
    app sits under a `root_path` the application did not see, and entering there would route
    the turn elsewhere.
    """
    app = ws_scope.get("app")
    seen: set[int] = set()
    node: Any = app
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if getattr(node, "settings", None) is settings:
            return app
        node = _below(node)
    return None


def say_where_turns_enter(scope: Scope, settings: Any) -> None:
    """Warn when socket turns may miss HTTP middleware a plain `POST` meets and no
    `authenticate` hook guards the handshake: no framework exposes an application holding the
    middleware (a pure ASGI wrapper outside it is invisible), or the socket came through a
    Starlette `Mount` (the mounting app, and its middleware, were replaced in `scope["app"]`
    by the sub-app's own; Starlette sets `app_root_path` only there)."""
    if settings.authenticate is not None:
        return
    if entry(scope, settings) is not None and "app_root_path" not in scope:
        return
    logger.warning(
        "WebSocket mode at %s: socket turns cannot reach the whole application, so HTTP "
        "middleware wrapped around it from outside (a pure ASGI wrapper, or an app that "
        "mounts this one) does not run on them. If such a middleware checks credentials, "
        "move it where turns meet it (the app's own middleware list, or the app "
        "WebSocketModeMiddleware wraps) or pass authenticate=.",
        settings.path,
    )


def find(app: Any, kind: type[T]) -> list[T]:
    """The instances of `kind` in `app`, outermost first: through wrapped apps (`.app`),
    Starlette's built middleware stack or, before the app started, its `user_middleware`
    list, and the apps mounted on a router. Never builds a stack."""
    found: list[T] = []
    seen: set[int] = set()
    pending: list[Any] = [app]
    while pending:
        node = pending.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, kind):
            found.append(node)
        if _is_starlette(node):
            if node.middleware_stack is not None:
                pending.append(node.middleware_stack)
            else:
                pending.extend(_made_early(node, kind))
                pending.append(getattr(node, "router", None))
            continue
        pending.append(getattr(node, "app", None))
        routes = getattr(node, "routes", None)
        if isinstance(routes, list):
            pending.extend(getattr(route, "app", None) for route in routes)
    return found


def _is_starlette(node: Any) -> bool:
    return hasattr(node, "build_middleware_stack") and hasattr(node, "middleware_stack")


def _below(node: Any) -> Any:
    """What `node` hands a request to: a Starlette app's built stack, a middleware's `.app`."""
    if _is_starlette(node):
        return node.middleware_stack
    return getattr(node, "app", None)


def _made_early(app: Any, kind: type[T]) -> list[T]:
    """The `kind` middlewares an app that has not started lists, made now: each entry of
    `user_middleware` becomes one that hands Starlette this very instance when it builds the
    stack, so what the caller holds is what will serve, and `add_middleware` still works."""
    made: list[T] = []
    for index, listed in enumerate(list(app.user_middleware)):
        factory: Any = getattr(listed, "cls", None)
        if isinstance(factory, _Made):
            if isinstance(factory.instance, kind):
                made.append(factory.instance)
            continue
        if not (isinstance(factory, type) and issubclass(factory, kind)):
            continue
        inner = _Inner()
        make: Any = factory  # a middleware class: it takes the app below, then its options
        instance: T = make(inner, *listed.args, **listed.kwargs)
        app.user_middleware[index] = type(listed)(_Made(instance, inner))
        made.append(instance)
    return made


class _Inner:
    """The app below a middleware made before its Starlette app built the stack: the next
    layer, named when the stack is built."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            raise RuntimeError("this middleware's application has not built its stack yet")
        await self.app(scope, receive, send)


class _Made:
    """A `Middleware` factory that gives Starlette the instance made early, below which it
    puts the next layer."""

    def __init__(self, instance: Any, inner: _Inner) -> None:
        self.instance = instance
        self.inner = inner
        self.__name__ = type(instance).__name__  # what Starlette's `Middleware` repr shows

    def __call__(self, app: ASGIApp, *args: Any, **kwargs: Any) -> Any:
        self.inner.app = app
        return self.instance
