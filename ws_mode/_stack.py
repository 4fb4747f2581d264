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

import importlib
import logging
from types import FrameType
from typing import Any, TypeVar

from ._asgi import ASGIApp, Receive, Scope, Send
from ._hooks import django_configured

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


def built_by_a_stack(frame: FrameType | None) -> bool:
    """Whether `frame` (the code constructing a middleware) is a framework building its
    middleware stack lazily: Starlette's and FastAPI's `build_middleware_stack`, run at the
    app's first call (the lifespan's, under a server that runs one), where an exception only
    reads to uvicorn as "lifespan unsupported" and then fails every request."""
    return frame is not None and frame.f_code.co_name == "build_middleware_stack"


#: What `handler_route` answers when the application cannot be asked (a plain ASGI app).
UNKNOWN = "unknown"


def handler_route(scope: Scope, settings: Any) -> str | None:
    """What is wrong with the route of `settings.handler_path` in the app socket turns enter,
    read at the lifespan startup from `scope`: None when a route serves `POST handler_path` (or
    the app serves every path, or routes to a mounted app, which may serve it), a sentence when
    it does not, `UNKNOWN` when the application has no routes to ask."""
    app: Any = entry(scope, settings) or settings.app
    path = settings.handler_path
    seen: set[int] = set()
    while app is not None and id(app) not in seen:  # down wrapping middlewares to the routes
        seen.add(id(app))
        router = getattr(app, "router", None) if _is_starlette(app) else None
        if router is None and isinstance(getattr(app, "routes", None), list):
            router = app  # a Starlette Router served as the app
        if router is not None:
            return _starlette_route(router, path)
        if type(app).__module__.startswith("django.") and django_configured():
            return _django_route(path)
        app = getattr(app, "app", None)
    return UNKNOWN


def _starlette_route(router: Any, path: str) -> str | None:
    from starlette.routing import Host, Match  # the app is Starlette's: it is installed

    if getattr(router, "default", None) != getattr(router, "not_found", None):
        return None  # a default app of the application's own answers every other path
    probe = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": []}
    partial = False
    for route in router.routes:
        if isinstance(route, Host):
            return None  # routed by the request's host, which a turn carries: cannot tell
        match, _ = route.matches(probe)
        if match == Match.FULL:
            return None
        partial = partial or match == Match.PARTIAL
    if partial:
        return f"the route at {path} does not take POST (turns would get 405 Method Not Allowed)"
    return f"no route of the application serves POST {path} (turns would get 404 Not Found)"


def _django_route(path: str) -> str | None:
    urls: Any = importlib.import_module("django.urls")  # Django runs this process
    try:
        urls.resolve(path)
    except urls.Resolver404:
        return f"no URL pattern of the Django project serves {path} (turns would get 404)"
    return None
