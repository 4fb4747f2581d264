"""OpenTelemetry spans of WebSocket mode: one per connection, one per turn, and the trace context
handed on to the handler (and, through the proxy, to the upstream).

Only `opentelemetry-api` is used (the `otel` extra), imported on first use: without it, or while
the application has installed no SDK (OpenTelemetry's global tracer provider is still its
proxy, which records nothing), a middleware makes no span and does no per-turn work beyond one
check. With one, a connection's span has the handshake's ``traceparent`` as its parent (or the
span current when the middleware is called: an application's own ASGI instrumentation already
made one from it), and each turn's span is a child of its connection's. While the handler runs,
the turn's span is the current one (the handler's own spans nest under it) and the turn's
request carries it in its headers (``traceparent``, written by the global propagator), so an
application with OpenTelemetry's ASGI or FastAPI instrumentation continues the same trace.

Spans are made per connection and per turn only: nothing is done per event. The attributes
follow OpenTelemetry's semantic conventions where one exists (``client.address``,
``url.path``, ``gen_ai.response.id``, ``error.type``, ...); the rest are ``ws_mode.*``
(docs/operations.md, "Tracing", lists them). Every string attribute is cut to
`ws_mode._logs.LOG_VALUE_CHARS` characters (`ws_mode._logs.cut_strings`) as the span is made
and as it ends: many are the client's (its model, ids, address, user agent), and an SDK holds
each span until its exporter delivers it (2,048 of them queued while a collector is down),
outside the memory budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ._asgi import Scope
from ._errors import ConfigError
from ._logs import cut, cut_strings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: The instrumentation scope the spans are made under.
INSTRUMENTATION_NAME: Final = "ws_mode"
#: How long the end of a drain waits for the tracer provider to export what it holds.
FLUSH_SECONDS: Final = 5.0
#: The GenAI conventions' operation and provider of a turn: a Responses API call, in OpenAI's
#: format (the model behind it may be anyone's: `gen_ai.request.model` says which).
OPERATION_NAME: Final = "chat"
PROVIDER_NAME: Final = "openai"

logger = logging.getLogger(__name__)
#: The turn span's name: the client event it serves.
TURN_SPAN: Final = "response.create"

_NOT_LOADED: Final = object()
_api: Any = _NOT_LOADED


class _Api:
    """The parts of opentelemetry-api ws_mode uses, imported once."""

    def __init__(self) -> None:
        self.context = importlib.import_module("opentelemetry.context")
        self.propagate = importlib.import_module("opentelemetry.propagate")
        self.trace = importlib.import_module("opentelemetry.trace")


def _load() -> _Api | None:
    """opentelemetry-api, or None when it is not installed (imported on the first call only)."""
    global _api
    if _api is _NOT_LOADED:
        try:
            _api = _Api()
        except ImportError:
            _api = None
    loaded: _Api | None = _api
    return loaded


class Tracing:
    """Where one middleware's spans go: its `tracer_provider`, or OpenTelemetry's global one
    (looked up as each connection opens, so an SDK installed after the middleware was made
    counts)."""

    __slots__ = ("_api", "_provider", "_tracer")

    def __init__(self, api: _Api, provider: TracerProvider | None) -> None:
        self._api = api
        self._provider = provider
        self._tracer: tuple[object, Tracer] | None = None

    def tracer(self) -> Tracer | None:
        """The tracer for a new connection; None while the provider records nothing (the
        global one before an SDK is installed, or a no-op provider)."""
        trace = self._api.trace
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
        cached = self._tracer
        if cached is None or cached[0] is not provider:
            tracer = provider.get_tracer(INSTRUMENTATION_NAME, _version())
            self._tracer = cached = (provider, tracer)
        return cached[1]

    async def flush(self) -> None:
        """Export what the tracer provider still holds (its ``force_flush``, in a daemon
        thread of its own, waited for at most :data:`FLUSH_SECONDS`): the end of a drain calls
        it, since uvicorn ends its process with the signal it got once it shut down, and exit
        hooks (where an SDK exports its queue) never run. A flush that hangs (an exporter that
        never returns) keeps neither the drain nor the process's exit waiting."""
        trace = self._api.trace
        provider = self._provider if self._provider is not None else trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if not callable(force_flush):
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[object] = loop.create_future()

        def flush() -> None:
            try:
                result: object = force_flush(int(FLUSH_SECONDS * 1000))
            except Exception as exc:  # handed to the loop, which logs it
                _hand_over(loop, done, exc)
            else:
                _hand_over(loop, done, result)

        threading.Thread(target=flush, name="ws_mode-span-flush", daemon=True).start()
        try:
            result = await asyncio.wait_for(done, FLUSH_SECONDS + 1)
        except TimeoutError:
            result = False
        if isinstance(result, Exception):
            logger.warning(
                "Exporting the spans at the end of the drain failed",
                exc_info=(type(result), result, result.__traceback__),
            )
        elif result is False:
            logger.warning("The spans were not all exported within %.0f s", FLUSH_SECONDS)

    def connection(self, scope: Scope, path: str, connection_id: str) -> ConnectionSpan | None:
        """The span of a connection accepted now (None while there is no tracer)."""
        tracer = self.tracer()
        if tracer is None:
            return None
        return ConnectionSpan(self._api, tracer, scope, path, connection_id)


def _hand_over(
    loop: asyncio.AbstractEventLoop, done: asyncio.Future[object], value: object
) -> None:
    """Resolve `done` with `value` from another thread, unless its loop has closed."""

    def resolve() -> None:
        if not done.done():
            done.set_result(value)

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
        loop.call_soon_threadsafe(resolve)


def _version() -> str | None:
    """ws_mode's version as installed (the instrumentation scope's), if it is."""
    try:
        return importlib.metadata.version("ws-mode")
    except importlib.metadata.PackageNotFoundError:
        return None


def tracing_for(tracer_provider: object) -> Tracing | None:
    """A middleware's `Tracing` for its `tracer_provider` keyword: None (OpenTelemetry's global
    provider) or a provider. None when tracing is off: opentelemetry-api is not installed and
    no provider was given, or the provider is a `NoOpTracerProvider`."""
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise ConfigError(
            "tracer_provider must be None (OpenTelemetry's global tracer provider) or an "
            f"opentelemetry.trace.TracerProvider, got {tracer_provider!r}."
        )
    api = _load()
    if api is None:
        if tracer_provider is not None:
            raise ConfigError(
                "tracer_provider needs opentelemetry-api: pip install 'ws-mode[otel]' "
                "(from a checkout: pip install '.[otel]')."
            )
        return None
    if isinstance(tracer_provider, api.trace.NoOpTracerProvider):
        return None
    provider: TracerProvider | None = tracer_provider  # type: ignore[assignment]
    return Tracing(api, provider)


class ConnectionSpan:
    """The span of one connection, current while the connection runs, parent of its turns'."""

    __slots__ = ("_api", "_token", "connection_id", "context", "span", "tracer")

    def __init__(
        self, api: _Api, tracer: Tracer, scope: Scope, path: str, connection_id: str
    ) -> None:
        self._api = api
        self.tracer = tracer
        self.connection_id = connection_id
        trace = api.trace
        parent = api.context.get_current()
        if trace.get_current_span(parent).get_span_context().is_valid:
            kind = trace.SpanKind.INTERNAL  # under the application's own server span
        else:
            parent = api.propagate.extract(_carrier(scope.get("headers", ())), context=parent)
            kind = trace.SpanKind.SERVER
        attributes: dict[str, Any] = {
            "network.protocol.name": "websocket",
            "url.path": scope.get("path", path),
            "url.scheme": scope.get("scheme", "ws"),
            "ws_mode.connection.id": connection_id,
        }
        client = scope.get("client")
        if client:
            attributes["client.address"] = str(client[0])
            if len(client) > 1 and client[1]:  # 0: unknown (a proxy's X-Forwarded-For)
                attributes["client.port"] = int(client[1])
        for name, value in scope.get("headers", ()):
            if name == b"user-agent":
                attributes["user_agent.original"] = value.decode("latin-1")
                break
        self.span: Span = tracer.start_span(
            f"WebSocket {path}", context=parent, kind=kind, attributes=cut_strings(attributes)
        )
        self.context: Context = trace.set_span_in_context(self.span, parent)
        self._token: object = None

    def attach(self) -> None:
        """Make the connection's span the current one (in the task serving the socket)."""
        self._token = self._api.context.attach(self.context)

    def turn(
        self, *, stream_id: str | None, previous_response_id: str | None, model: str | None
    ) -> TurnSpan:
        """The span of a turn starting now (`model`: the one the request names), made the
        current one until it ends."""
        return TurnSpan(self, stream_id, previous_response_id, model)

    def end(self, attributes: dict[str, Any]) -> None:
        """End the span with what the closed connection did; stop it being the current one."""
        span = self.span
        if span.is_recording():
            span.set_attributes(cut_strings(attributes))
        span.end()
        if self._token is not None:
            self._api.context.detach(self._token)
            self._token = None


class TurnSpan:
    """The span of one turn: a child of its connection's, current while the turn runs (so the
    handler's task, created meanwhile, has it too)."""

    __slots__ = ("_api", "_token", "context", "span")

    def __init__(
        self,
        connection: ConnectionSpan,
        stream_id: str | None,
        previous_response_id: str | None,
        model: str | None,
    ) -> None:
        api = self._api = connection._api
        attributes: dict[str, Any] = {
            "ws_mode.connection.id": connection.connection_id,
            "gen_ai.operation.name": OPERATION_NAME,
            "gen_ai.provider.name": PROVIDER_NAME,
        }
        if model is not None:
            attributes["gen_ai.request.model"] = model
        if stream_id is not None:
            attributes["ws_mode.stream_id"] = stream_id
        if previous_response_id is not None:
            attributes["ws_mode.previous_response_id"] = previous_response_id
        self.span: Span = connection.tracer.start_span(
            TURN_SPAN, context=connection.context, attributes=cut_strings(attributes)
        )
        self.context: Context = api.trace.set_span_in_context(self.span, connection.context)
        self._token: object = api.context.attach(self.context)

    def handler_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """`headers` for the turn's request with the turn's trace context written in by the
        global propagator (``traceparent``...), replacing those the handshake carried."""
        carrier: dict[str, str] = {}
        propagate = self._api.propagate
        propagate.inject(carrier, context=self.context)
        if not carrier:
            return headers
        return with_trace_headers(headers, carrier, propagate.get_global_textmap().fields)

    def end(self, attributes: dict[str, Any], error: str | None) -> None:
        """End the span with what the turn did (`error`: the code it failed with); stop it
        being the current one."""
        span = self.span
        if span.is_recording():
            span.set_attributes(cut_strings(attributes))
            if error is not None:
                span.set_status(
                    self._api.trace.Status(self._api.trace.StatusCode.ERROR, cut(error))
                )
        span.end()
        self._api.context.detach(self._token)


def with_trace_headers(
    headers: Iterable[tuple[bytes, bytes]], carrier: dict[str, str], fields: Iterable[str]
) -> list[tuple[bytes, bytes]]:
    """`headers` without the propagator's `fields` (``traceparent``, ``tracestate``,
    ``baggage``...), then `carrier`'s headers."""
    names = {field.lower().encode("latin-1") for field in fields}
    names.update(name.lower().encode("latin-1") for name in carrier)
    kept = [(name, value) for name, value in headers if name.lower() not in names]
    kept.extend(
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in carrier.items()
    )
    return kept


def inject_current(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with the current trace context written in (the proxy's upstream request),
    when opentelemetry-api is installed and a span is current; else `headers` as they are."""
    api = _load()
    if api is None or not api.trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier: dict[str, str] = {}
    api.propagate.inject(carrier)
    if not carrier:
        return headers
    return with_trace_headers(headers, carrier, api.propagate.get_global_textmap().fields)


def _carrier(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as the propagator reads them (the first value of each name)."""
    carrier: dict[str, str] = {}
    for name, value in headers:
        carrier.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return carrier
