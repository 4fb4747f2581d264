"""The ASGI middleware: sockets at `path` become WebSocket mode, everything else passes through."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import _logs as logs
from . import _stack as stack
from ._asgi import ASGIApp, Message, Receive, Scope, Send
from ._auth import (
    AuthenticationFailed,
    Authenticator,
    PrincipalKey,
    authenticate,
    challenge,
    failure_code,
    failure_param,
    principal_key,
)
from ._budget import CONNECTION_COST, MemoryBudget
from ._connection import Connection
from ._conversation import DEFAULT_HEADERS, ConversationKeys
from ._errors import ConfigError
from ._headers import handshake_answer_headers
from ._hooks import call_hook
from ._limits import Limits
from ._observe import Observer
from ._origins import OriginPolicy
from ._persistence import flush_writes, store_scope
from ._protocol import (
    FULL_CONTEXT_HEADER,
    SERVER_IS_OVERLOADED,
    SERVER_SHUTTING_DOWN,
    error_body,
    error_type_for_status,
    hook_failed_message,
    json_answer,
    memory_budget_message,
)
from ._settings import (
    CacheMiss,
    FullContext,
    HandshakeHeaders,
    ResponseHook,
    Settings,
    check_principals,
)
from ._stateful_http import StatefulHTTP
from ._store import ResponseStore, check_store
from ._tokens import Renderer
from ._tracing import tracing_for
from ._turn import turn

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
Init = Callable[Concatenate["WebSocketModeMiddleware", ASGIApp, P], None]


def _fails_the_start(init: Init[P]) -> Init[P]:
    """Make a bad option fail the server's start when a framework builds the middleware lazily.

    Starlette and FastAPI make the middlewares of `app.add_middleware(...)` at the app's first
    call, the lifespan's: an exception there reads to uvicorn's default `--lifespan auto` as a
    lifespan the app does not support, so the server starts and every request fails with 500.
    Made there, a middleware with a bad option (an unknown one too) keeps its `ConfigError` and
    fails the lifespan startup with it; made anywhere else, it raises at once.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def checked(
        self: WebSocketModeMiddleware, app: ASGIApp, /, *args: P.args, **kwargs: P.kwargs
    ) -> None:
        try:
            try:
                signature.bind(self, app, *args, **kwargs)
            except TypeError as exc:
                unknown = sorted(set(kwargs) - set(signature.parameters))
                known = ", ".join(
                    name for name in signature.parameters if name not in ("self", "app")
                )
                if unknown:
                    raise ConfigError(
                        f"no option {', '.join(map(repr, unknown))}: the options are {known}."
                    ) from None
                raise ConfigError(f"WebSocketModeMiddleware: {exc}.") from None
            init(self, app, *args, **kwargs)
        except ConfigError as exc:
            if not stack.built_by_a_stack(sys._getframe(1)):
                raise
            self.app = app
            self._bad_options = exc

    return checked


class WebSocketModeMiddleware:
    """Adds OpenAI's Responses API WebSocket mode to an app serving `POST /v1/responses`.

    A WebSocket opened at `path` becomes a WebSocket mode connection whose turns call the
    wrapped app in-process as `POST handler_path` requests; all other traffic (plain HTTP to
    the same path included, other socket paths, lifespan) reaches the app untouched.

    `full_context="always"` gives the handler the whole history on every turn (drop-in for
    stateless handlers); `"on_miss"` gives it only the new input plus `previous_response_id`
    when the parent is cached, and the cached state through `ws_mode.turn(request)`.

    `renderer` renders items to token ids: each turn's new items are rendered once, the tokens
    are kept on the cached response, and the Turn hands the prefix's tokens to the handler.
    `on_response(turn, response)` runs after each finished response (completed, incomplete or
    failed), never delaying the next turn. `on_cache_miss="forward"` sends a create whose
    `previous_response_id` is not cached on to the handler as the client sent it, for handlers
    (upstreams) that store responses themselves; the default `"error"` answers
    `previous_response_not_found`.

    `authenticate(scope)` runs before a socket is accepted: it returns the principal the
    turns carry (`Turn.principal`) or raises `AuthenticationFailed` (401/403). `subprotocols`
    lists the subprotocols the server speaks: the first one the client offers is selected
    (browsers that offer subprotocols need one back). A browser's handshake (one with an
    `Origin` header) is refused with 403 unless it comes from the server's own origin or one in
    `allowed_origins` (`"https://app.example.com"`, `"https://*.example.com"`, `"*"`); clients
    that send no `Origin` are unaffected. `reauthenticate_seconds` runs `authenticate` again
    on the open socket once that long has passed since the last check, before each frame that
    causes work (a turn as it starts, queued or steered; a steer) (0: before every one): a
    revoked credential gets an error event and a close (1008). `store` keeps
    responses created with `store: true` beyond the connection (`ws_mode._store.MemoryStore` in
    this process, `ws_mode.redis_store.RedisStore` across workers and hosts): a
    `previous_response_id` missing from the connection's cache is hydrated from it. It keeps
    them per principal of `authenticate`, by its key: a `str`, `int`, `uuid.UUID` (or tuple of
    them) is its own, `principal_key(principal) -> str` keys any other; or, with
    `shared_store=True` and no hook, in one scope every caller shares (warned at startup).
    `stateful_http=True` serves plain HTTP from the same store: `previous_response_id` on
    `POST`, and `GET`/`DELETE {path}/{id}`.
    `steering` serves `response.steer` (`ws_mode._steering`): the response ends at its next
    output item and a successor continues with the input; False answers `steering_not_supported`.
    `interrupts` serves `response.interrupt` (as Codex sends it): the running response ends at
    once with `response.incomplete` (reason `interrupted`) and its handler call is stopped;
    False answers `response.interrupt.failed` with `interrupt_not_supported`, and the response
    runs to its end.
    `tracer_provider` is where the OpenTelemetry spans go (a span per connection and per turn,
    the turn's trace context passed to the handler; `ws_mode._tracing`): None is
    OpenTelemetry's global provider, which records nothing until the application installs an
    SDK (and nothing is done without `opentelemetry-api`); `NoOpTracerProvider()` turns
    tracing off. `access_log` writes a line per turn and per closed connection at INFO on the
    `ws_mode.access` logger, as uvicorn's access log (`ws_mode._access_log`); False turns it off.
    At the ASGI lifespan startup the store is asked whether it works (its `check()`): when it
    does not, the startup fails with what is wrong, unless `start_degraded=True`, which starts
    anyway with a loud warning (turns that need the store fail until it answers).
    `enabled=False` (settable at run time) answers upgrades with 426 so clients fall back to
    HTTP. `handshake_headers(scope, principal)` gives headers for the handshake's answer (Codex
    reads `openai-model`, `x-models-etag`, `x-reasoning-included`, `x-codex-turn-state` there);
    hop-by-hop and `Sec-WebSocket-*` names are refused, and a hook that fails refuses the
    upgrade with 500.
    Every chain of responses has a conversation key (`Turn.conversation_key`; docs/fleet.md):
    an HMAC with `conversation_key_secret` (None: a random secret for this process; a fleet
    shares one) of the principal's key and a seed (random, or the client's `prompt_cache_key`),
    made at the chain's first turn and kept with its responses in the cache and the store.
    Every handler call carries it in the headers `conversation_key_headers` names
    (`x-session-id` by default, replacing the client's; empty or None: none), for a router.
    `fill_prompt_cache_key=True` sends it as `prompt_cache_key` when the client sent none;
    `cache_salt=True` sends vLLM's `cache_salt`, a key of the principal's, on every turn.
    """

    #: The option error of a middleware a framework made lazily: the lifespan startup fails with
    #: it, every other call raises it (`_fails_the_start`).
    _bad_options: ConfigError | None = None

    @_fails_the_start
    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str = "/v1/responses",
        handler_path: str | None = None,
        full_context: FullContext = "always",
        limits: Limits | None = None,
        renderer: Renderer | None = None,
        on_response: ResponseHook | None = None,
        on_cache_miss: CacheMiss = "error",
        authenticate: Authenticator | None = None,
        subprotocols: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        reauthenticate_seconds: float | None = None,
        store: ResponseStore | None = None,
        principal_key: PrincipalKey | None = None,
        shared_store: bool = False,
        stateful_http: bool = False,
        steering: bool = True,
        interrupts: bool = True,
        tracer_provider: TracerProvider | None = None,
        access_log: bool = True,
        start_degraded: bool = False,
        enabled: bool = True,
        handshake_headers: HandshakeHeaders | None = None,
        conversation_key_secret: str | bytes | None = None,
        conversation_key_headers: Sequence[str] | None = DEFAULT_HEADERS,
        fill_prompt_cache_key: bool = False,
        cache_salt: bool = False,
    ) -> None:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"path must be a string starting with '/', got {path!r}.")
        if handler_path is not None and (
            not isinstance(handler_path, str) or not handler_path.startswith("/")
        ):
            raise ConfigError(
                f"handler_path must be None or a string starting with '/', got {handler_path!r}."
            )
        if full_context not in ("always", "on_miss"):
            raise ConfigError(f"full_context must be 'always' or 'on_miss', got {full_context!r}.")
        if on_cache_miss not in ("error", "forward"):
            raise ConfigError(f"on_cache_miss must be 'error' or 'forward', got {on_cache_miss!r}.")
        if isinstance(subprotocols, str) or not all(isinstance(p, str) for p in subprotocols):
            raise ConfigError(f"subprotocols must be a sequence of strings, got {subprotocols!r}.")
        if store is not None and not all(
            callable(getattr(store, name, None)) for name in ("put", "get_chain", "delete")
        ):
            raise ConfigError(
                f"store must be a response store (ws_mode._store.MemoryStore, "
                f"ws_mode.redis_store.RedisStore), got {store!r}."
            )
        if not isinstance(steering, bool):
            raise ConfigError(f"steering must be True or False, got {steering!r}.")
        if not isinstance(interrupts, bool):
            raise ConfigError(f"interrupts must be True or False, got {interrupts!r}.")
        if not isinstance(access_log, bool):
            raise ConfigError(f"access_log must be True or False, got {access_log!r}.")
        tracing = tracing_for(tracer_provider)
        if not isinstance(start_degraded, bool):
            raise ConfigError(f"start_degraded must be True or False, got {start_degraded!r}.")
        if stateful_http and store is None:
            raise ConfigError("stateful_http=True needs a store (store=...) to keep responses.")
        check_principals(authenticate, reauthenticate_seconds, store, principal_key, shared_store)
        if limits is None:
            limits = Limits()
        elif not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a ws_mode.Limits, got {type(limits).__name__}.")
        hooks = (
            ("renderer", renderer),
            ("on_response", on_response),
            ("authenticate", authenticate),
            ("handshake_headers", handshake_headers),
        )
        for name, hook in hooks:
            if hook is not None and not callable(hook):
                raise ConfigError(f"{name} must be callable or None, got {hook!r}.")
        conversations = ConversationKeys(
            conversation_key_secret,
            headers=conversation_key_headers,
            fill_prompt_cache_key=fill_prompt_cache_key,
            cache_salt=cache_salt,
        )
        self.app = app
        self.settings = Settings(
            app=app,
            path=path.rstrip("/") or "/",
            handler_path=handler_path or path,
            full_context=full_context,
            limits=limits,
            renderer=renderer,
            on_response=on_response,
            on_cache_miss=on_cache_miss,
            subprotocols=tuple(subprotocols),
            authenticate=authenticate,
            reauthenticate_seconds=reauthenticate_seconds,
            store=store,
            principal_key=principal_key,
            shared_store=shared_store,
            steering=steering,
            interrupts=interrupts,
            handshake_headers=handshake_headers,
            budget=MemoryBudget(limits.max_memory_bytes),
            observer=Observer(tracing=tracing, access_log=access_log),
            conversations=conversations,
        )
        self.authenticate = authenticate
        self.start_degraded = start_degraded
        self._origins = OriginPolicy(allowed_origins)
        self._stateful = (
            StatefulHTTP(self.settings, store) if stateful_http and store is not None else None
        )
        #: Switch WebSocket mode off (upgrades answered 426) or on again, at run time.
        self.enabled = enabled
        self.connections = 0
        self._open: set[Connection] = set()
        self._per_client: dict[Any, int] = {}
        self._draining = False
        #: One future per upgrade hook running now, resolved when a drain begins: the
        #: upgrade is refused at once (futures, not an `asyncio.Event`, which binds itself to
        #: one event loop, where the same middleware may be served on another one later).
        self._drain_waiters: set[asyncio.Future[None]] = set()
        #: The upgrades admitted and not yet accepted or refused, each resolved as it is.
        self._upgrading: set[asyncio.Future[None]] = set()
        #: Counters of this middleware's connections and turns (`stats.snapshot()`).
        self.stats = self.settings.stats
        # A copy: a scrape may run in another thread (prometheus_client's own HTTP server).
        self.stats.live_evictions = lambda: sum(c.cache.evictions for c in list(self._open))
        self.stats.budget = self.settings.budget
        if store is not None:
            _bound_store(store, limits)

    async def drain(self, grace: float | None = None) -> None:
        """Shut WebSocket mode down gracefully: refuse new sockets (HTTP 503 with
        `Retry-After`, which clients retry), those not yet accepted too (their `authenticate`
        or `handshake_headers` hook still running: answered at once, within
        `Limits.close_timeout_seconds`), and new work on the open ones (a create, queued or
        new, a steer, a successor turn for steering input: `server_shutting_down`);
        give running turns up to `grace` seconds (default `Limits.shutdown_grace_seconds`),
        then close every socket with 1001 so clients reconnect; last, wait for the store
        writes under way in this process to land (each ends within
        `Limits.store_write_seconds`), and for the tracer provider to export the spans it
        holds. The access log has a line as it begins and one as it ends. Call it before the
        server closes its
        connections (`ws_mode.server.Server` does, for uvicorn); the lifespan shutdown calls
        it too."""
        began = not self._draining
        self._draining = True
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        if grace is None:
            grace = self.settings.limits.shutdown_grace_seconds
        started = time.perf_counter()
        connections = list(self._open)
        for connection in connections:
            connection.begin_draining()
        upgrading = set(self._upgrading)
        running = sum(connection.running for connection in connections)
        if began:
            self.settings.observer.drain_began(
                self.settings.path,
                sockets=len(connections),
                turns=running,
                upgrades=len(upgrading),
                grace=grace,
            )
        # Upgrades not yet accepted (their authenticate or handshake_headers hook running)
        # are answered 503 now: the server's own shutdown would cut them later.
        if upgrading:
            await asyncio.wait(upgrading, timeout=self.settings.limits.close_timeout_seconds)
        cut = sum(await asyncio.gather(*(connection.drain(grace) for connection in connections)))
        if began:
            self.settings.observer.drain_ended(
                self.settings.path,
                duration=time.perf_counter() - started,
                sockets=len(connections),
                finished=max(running - cut, 0),
                cut=cut,
            )
        await flush_writes(self.settings.limits.store_write_seconds)
        tracing = self.settings.observer.tracing
        if tracing is not None:
            await tracing.flush()  # the process may end at once: uvicorn re-raises its signal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._bad_options is not None:
            await _refuse_to_start(self._bad_options, scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "websocket" or not self._is_socket_path(scope):
            if scope["type"] != "http":
                await self.app(scope, receive, send)
            elif self._stateful is not None and self._stateful.handles(scope):
                await self._stateful(scope, receive, send)
            elif turn(scope) is not None:
                # A socket turn on its way down from the application's entry: the app below,
                # as its settings name it (a compatibility check records there).
                await self.settings.app(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "websocket.connect":
            return  # the client left before the handshake finished
        self._say_where_turns_enter(scope)
        if self._draining:
            # Only an upgrade that got in just before the server stopped listening, or one to
            # a server that drains while it listens: 503, which clients retry (elsewhere,
            # through a balancer), where a 426 would send Codex to HTTP for good.
            await self._refuse_draining(scope, send)
            return
        if not self.enabled:
            await self._refuse(
                scope,
                send,
                426,
                "websocket_mode_disabled",
                "WebSocket mode is switched off on this server; use the HTTP API.",
            )
            return
        if not self._origins.allows(scope):
            await self._refuse(
                scope,
                send,
                403,
                "origin_not_allowed",
                "This origin may not open WebSocket mode sockets here "
                "(WebSocketModeMiddleware's allowed_origins).",
            )
            return
        if self.connections >= self.settings.limits.max_connections:
            logger.warning(
                "refusing a WebSocket mode connection: %d open, Limits.max_connections is %d",
                self.connections,
                self.settings.limits.max_connections,
            )
            await self._refuse(
                scope,
                send,
                426,
                "websocket_connection_limit_reached",
                f"This server already serves {self.connections} WebSocket mode "
                "connections; use the HTTP API or retry later.",
            )
            return
        # The process's memory budget: a socket holds its own cost while it is open, and none
        # is opened while the budget refuses work (a new socket would only bring more).
        budget = self.settings.budget
        if not budget.admits_connection() or not budget.reserve(CONNECTION_COST):
            logger.warning("refusing a WebSocket mode connection: Limits.max_memory_bytes is used")
            why = memory_budget_message("a new WebSocket mode connection", upgrade=True)
            await self._refuse(scope, send, 503, SERVER_IS_OVERLOADED, why)
            return
        self.connections += 1
        upgrading = asyncio.get_running_loop().create_future()
        self._upgrading.add(upgrading)
        try:
            try:
                identity = await self._authenticate(scope, send)
            except _DrainBegan:
                await self._refuse_draining(scope, send)
                return
            if identity is None:
                return
            principal, owner, client = identity
            cap = self.settings.limits.max_connections_per_client
            if cap is not None and self._per_client.get(client, 0) >= cap:
                await self._refuse(
                    scope,
                    send,
                    426,
                    "websocket_connection_limit_reached",
                    f"This client already has {cap} WebSocket mode connections open here "
                    "(Limits.max_connections_per_client); close one, or use the HTTP API.",
                )
                return
            self._per_client[client] = self._per_client.get(client, 0) + 1
            try:
                await self._serve(scope, receive, send, principal, owner, upgrading)
            finally:
                self._per_client[client] -= 1
                if not self._per_client[client]:
                    del self._per_client[client]
        finally:
            self._upgraded(upgrading)
            self.connections -= 1
            budget.release(CONNECTION_COST)

    def _upgraded(self, upgrading: asyncio.Future[None]) -> None:
        """The upgrade `upgrading` stands for is accepted, or refused: a drain no longer
        waits for it."""
        self._upgrading.discard(upgrading)
        if not upgrading.done():
            upgrading.set_result(None)

    async def _before_drain(self, hook: Coroutine[Any, Any, T]) -> T:
        """What `hook` (a step of an upgrade before its accept) returns, unless a drain
        begins first: then it is cancelled (a plain function's thread runs on, its result
        unused) and `_DrainBegan` raised."""
        if self._draining:
            hook.close()
            raise _DrainBegan
        task = asyncio.ensure_future(hook)
        drain = asyncio.get_running_loop().create_future()
        self._drain_waiters.add(drain)
        try:
            await asyncio.wait((task, drain), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._drain_waiters.discard(drain)
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise _DrainBegan
        return task.result()

    async def _refuse_draining(self, scope: Scope, send: Send) -> None:
        """Refuse an upgrade the server's drain meets: 503 with `Retry-After`."""
        await self._refuse(
            scope,
            send,
            503,
            SERVER_SHUTTING_DOWN,
            "This server is shutting down; connect again.",
            headers=[(b"retry-after", b"1")],
        )

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        principal: Any,
        owner: str | None,
        upgrading: asyncio.Future[None],
    ) -> None:
        subprotocol = next(
            (p for p in scope.get("subprotocols", ()) if p in self.settings.subprotocols), None
        )
        headers: list[tuple[bytes, bytes]] = []
        hook = self.settings.handshake_headers
        try:
            if hook is not None:
                try:
                    headers = handshake_answer_headers(
                        await self._before_drain(call_hook(hook, scope, principal))
                    )
                except _DrainBegan:
                    raise
                except Exception as exc:  # raised, or returned headers that cannot be sent
                    logs.hook_raised(
                        logger, "handshake_headers", exc, "the upgrade is refused (500)"
                    )
                    message = hook_failed_message("handshake_headers")
                    await self._refuse(
                        scope, send, 500, "server_error", message, param="handshake_headers"
                    )
                    return
            if self._draining:  # it began while the limits were checked
                raise _DrainBegan
        except _DrainBegan:
            await self._refuse_draining(scope, send)
            return
        headers.append((FULL_CONTEXT_HEADER, self.settings.full_context.encode()))
        connection = Connection(self.settings, scope, receive, send)
        # From here on a drain finds it among the open connections (it accepts, then closes
        # with 1001 once its turns end).
        self._open.add(connection)
        self._upgraded(upgrading)
        self.stats.connections_open += 1
        self.stats.connections_total += 1
        try:
            await connection.run(
                principal=principal, owner=owner, subprotocol=subprotocol, headers=headers
            )
        finally:
            self._open.discard(connection)
            self.stats.connection_closed(connection.cache.evictions)

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        status: int,
        code: str,
        message: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        param: str | None = None,
    ) -> None:
        """Refuse the upgrade with an HTTP status and an OpenAI error body, through the denial
        response extension; servers without it get a close before accept (they answer 403)."""
        self.stats.connections_refused += 1
        logs.refused_here()
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008 if status in (401, 403) else 1013})
            return
        kind = error_type_for_status(status)
        body = error_body(kind, code, message, param)
        for answer in json_answer("websocket.http.response", status, body, headers):
            await send(answer)

    _entry_said = False

    def _say_where_turns_enter(self, scope: Scope) -> None:
        if not self._entry_said:  # once, at the first socket
            self._entry_said = True
            stack.say_where_turns_enter(scope, self.settings)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's lifespan, after the store answered the startup's check: a store that
        does not work fails the startup (the app never starts), or, with `start_degraded`,
        is a loud warning."""
        first = await receive()
        if first["type"] == "lifespan.startup":
            problem = self._route_problem(scope)
            if problem is not None:
                await send({"type": "lifespan.startup.failed", "message": problem})
                return
        if first["type"] == "lifespan.startup" and self.settings.store is not None:
            problem = await _check_store(self.settings.store, self.settings.limits)
            if problem is not None and not self.start_degraded:
                # The server logs the message (uvicorn, hypercorn) and exits.
                message = (
                    f"{problem}. Fix the store, or start anyway with start_degraded=True "
                    "(ws-mode: --start-degraded)"
                )
                await send({"type": "lifespan.startup.failed", "message": message})
                return
            if problem is not None:
                logger.warning(
                    "STARTING DEGRADED (start_degraded=True): %s. Until it works, turns that "
                    "continue a response missing from their connection's cache fail "
                    "(store_unavailable), and no response is kept",
                    problem,
                )
        replayed = [first]

        async def receive_again() -> Message:
            return replayed.pop() if replayed else await receive()

        await self.app(scope, self._lifespan_receive(receive_again), send)

    def _route_problem(self, scope: Scope) -> str | None:
        """Why turns would not reach a handler (no route serves `POST handler_path`), asked at
        the lifespan startup where the framework can tell; where it cannot, said once in the
        log."""
        problem = stack.handler_route(scope, self.settings)
        handler_path = self.settings.handler_path
        if problem == stack.UNKNOWN:
            logger.info(
                "WebSocket mode at %s: this application has no routes ws_mode can read, so it "
                "cannot check that it serves POST %s (handler_path), where every turn goes; "
                "if turns fail with 404, handler_path names no route",
                self.settings.path,
                handler_path,
            )
            return None
        if problem is None:
            return None
        return (
            f"WebSocket mode at {self.settings.path}: {problem}, where every turn goes "
            f"(WebSocketModeMiddleware's handler_path={handler_path!r}). Give the path of the "
            "app's POST /v1/responses handler."
        )

    def _lifespan_receive(self, receive: Receive) -> Receive:
        """Drain the sockets when the server announces its shutdown, before the app hears;
        serve again after a new startup."""

        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._draining = False  # the same app may be served again
                _warn_if_the_server_sends_no_pings(self.settings.limits)
            elif message["type"] == "lifespan.shutdown":
                await self.drain()
            return message

        return wrapped

    async def _authenticate(
        self, scope: Scope, send: Send
    ) -> tuple[Any, str | None, str | tuple[str, Any] | None] | None:
        """The handshake's principal, its store scope and whose connection it is for
        `max_connections_per_client` (the principal's key, else the client's address); None
        once the upgrade is refused."""
        settings = self.settings
        try:
            principal = None
            if self.authenticate is not None:
                # A drain beginning meanwhile raises `_DrainBegan`: the upgrade is refused 503.
                principal = await self._before_drain(authenticate(self.authenticate, scope))
            owner = None
            if settings.store is not None:
                owner = store_scope(principal, settings.principal_key, shared=settings.shared_store)
            client: str | tuple[str, Any] | None = None
            if settings.limits.max_connections_per_client is None:
                pass
            elif self.authenticate is not None and principal is not None:
                client = principal_key(principal, settings.principal_key)
            else:  # no principal: the client's address
                client = ("address", scope["client"][0] if scope.get("client") else None)
        except AuthenticationFailed as exc:  # an unkeyed principal too: a 500
            headers = challenge(exc)
            code, param = failure_code(exc), failure_param(exc)
            await self._refuse(
                scope, send, exc.status, code, exc.message, headers=headers, param=param
            )
            return None
        return principal, owner, client

    def _is_socket_path(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path != "/" and path.endswith("/"):
            path = path[:-1]
        root_path: str = scope.get("root_path", "")
        wanted = self.settings.path
        return path == wanted or (bool(root_path) and path == root_path + wanted)


async def _refuse_to_start(
    problem: ConfigError, scope: Scope, receive: Receive, send: Send
) -> None:
    """A middleware with a bad option, made by a framework at its first call: the lifespan
    startup fails with the option's error (the server logs it and exits); anything else raises
    it."""
    if scope["type"] != "lifespan":
        raise problem
    message = await receive()
    if message["type"] == "lifespan.startup":
        await send(
            {"type": "lifespan.startup.failed", "message": f"WebSocketModeMiddleware: {problem}"}
        )


class _DrainBegan(Exception):
    """A drain began while an upgrade was not yet accepted: it is refused (503)."""


def _warn_if_the_server_sends_no_pings(limits: Limits) -> None:
    """Warn at startup when the server in use sends no WebSocket pings (ASGI apps cannot)."""
    if "granian" not in sys.modules:
        return
    idle = limits.max_idle_seconds
    logger.warning(
        "granian sends no WebSocket pings: a client that vanishes without a close keeps its "
        "WebSocket mode connection until %s",
        f"Limits.max_idle_seconds ({idle:g} s) closes it" if idle is not None else "it ends",
    )


async def _check_store(store: ResponseStore, limits: Limits) -> str | None:
    """What is wrong with the store, asked at startup within `Limits.store_read_seconds`
    (its warnings logged), or None."""
    problem, warnings = await check_store(store, limits.store_read_seconds)
    for warning in warnings:
        logger.warning("WebSocket mode's store: %s", warning)
    if problem is None:
        return None
    return f"WebSocket mode's store does not work: {problem.rstrip('.')}"


def _bound_store(store: ResponseStore, limits: Limits) -> None:
    """Pass `Limits.max_stored_bytes_per_principal` to the store; say so when it cannot
    enforce it (a store of the application's own without `limit_principal_bytes`)."""
    bound = limits.max_stored_bytes_per_principal
    limit = getattr(store, "limit_principal_bytes", None)
    if callable(limit):
        limit(bound)
    elif bound is not None:
        logger.warning(
            "%s has no limit_principal_bytes(): Limits.max_stored_bytes_per_principal is not "
            "enforced, and one principal may fill the store",
            type(store).__name__,
        )


def find_middlewares(app: Any) -> list[WebSocketModeMiddleware]:
    """The WebSocket mode middlewares inside an ASGI app, outermost first: the instances that
    serve (or will serve) its sockets.

    It follows wrapped apps (`.app`), Starlette's and FastAPI's middleware stack (what
    `app.add_middleware(WebSocketModeMiddleware)` or `Middleware(...)` built), and the apps
    mounted on a router. It never builds a stack, so `add_middleware` still works afterwards:
    for an app that has not started, the middleware its `user_middleware` list names is made
    now (its options are checked then), and the app uses that very instance when it builds its
    stack on its first call. Use it to reach the instances for `stats`, `drain()`, `enabled`
    or `ws_mode.prometheus.register`.
    """
    return stack.find(app, WebSocketModeMiddleware)
