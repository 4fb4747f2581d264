"""Recipe: WebSocket mode for an upstream that stores responses: it gets only the new items.

`ws-mode proxy` (and `create_proxy` with the default `full_context="always"`) sends the upstream
the whole history on every turn: right for a stateless upstream, but an upstream that stores
responses (OpenAI with `store: true`, vLLM with its response store, a server behind
`WebSocketModeMiddleware(..., store=..., stateful_http=True)`) already has the history. Here:

- `full_context="on_miss"`: a turn whose parent is in the socket's cache goes up with only its
  new items and `previous_response_id`, as the client sent them; the upstream resolves the id;
- `on_cache_miss="forward"`: an id this socket never saw (a response made over plain HTTP, or on
  an earlier connection) goes up too, instead of `previous_response_not_found`.

Clients must let the upstream store their responses (`store` true, or left out where the
upstream stores by default). The command line does the same:
`ws-mode proxy --upstream URL --full-context on_miss --forward-uncached`.

Run (needs the proxy's HTTP client, the `proxy` extra: httpx, and aiohttp where installed):

    UPSTREAM_URL=https://api.openai.com/v1 uvicorn examples.cache_aware_proxy:app \\
        --ws ws_mode.server:BatchingWebSocketProtocol --ws-max-size 68157440
"""

from __future__ import annotations

import os

from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy


def create_app(upstream: str, *, api_key: str | None = None) -> WebSocketModeMiddleware:
    """WebSocket mode for the storing Responses API at `upstream` (a base URL: `.../v1`).

    Without `api_key` the client's own `Authorization` goes up (from the socket's handshake)."""
    return WebSocketModeMiddleware(
        create_proxy(upstream, api_key=api_key),
        full_context="on_miss",  # the upstream has the history: send it only the new items
        on_cache_miss="forward",  # and let it resolve ids this socket never saw
    )


app = create_app(
    os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001/v1"),
    api_key=os.environ.get("UPSTREAM_API_KEY"),
)
