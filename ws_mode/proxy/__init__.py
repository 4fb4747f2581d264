"""A streaming HTTP proxy to a remote Responses server, as an ASGI app.

Wrapped by :class:`~ws_mode.WebSocketModeMiddleware`, it gives WebSocket mode to any server that
speaks the HTTP Responses API (vLLM, Ollama, LiteLLM, OpenAI itself)::

    from .. import WebSocketModeMiddleware
    from . import create_proxy

    app = WebSocketModeMiddleware(create_proxy("http://localhost:8000/v1"))

Every HTTP request is forwarded with aiohttp (httpx when aiohttp is not installed, or when you
pass an ``httpx.AsyncClient``), streaming both ways: the request body goes up as it arrives, the
answer comes down chunk by chunk as the upstream sends it (an SSE stream flows event by event).
See ``docs/proxy.md`` for the path rule (a request goes to the upstream's origin or is refused
400: :class:`TargetRefused`), authentication and limits. Needs the ``proxy`` extra
(aiohttp and httpx): ``pip install ".[proxy]"`` in a clone of ws_mode.

The ASGI app is :mod:`ws_mode.proxy._app`; the upstream side (URL, headers, failures) is
:mod:`ws_mode.proxy._upstream`; the HTTP clients are :mod:`ws_mode.proxy._transport`.
"""

from ._app import ResponsesProxy, create_proxy
from ._upstream import API_PREFIX as API_PREFIX
from ._upstream import DEFAULT_LIMITS, DEFAULT_TIMEOUT, TargetRefused

__all__ = ["DEFAULT_LIMITS", "DEFAULT_TIMEOUT", "ResponsesProxy", "TargetRefused", "create_proxy"]
