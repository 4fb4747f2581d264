"""OpenAI's Responses API WebSocket mode for any HTTP Responses server, as ASGI middleware.

from ws_mode import WebSocketModeMiddleware
app.add_middleware(WebSocketModeMiddleware)

The names below are the library's public API (docs/api.md lists every argument). The modules
whose names start with an underscore are internal: they may change in any release. The public
modules besides this one are `ws_mode.proxy`, `ws_mode.testing`, `ws_mode.redis_store`,
`ws_mode.server`, `ws_mode.prometheus` and `ws_mode.fastapi`; `ws_mode.toolkit` is the `ws-mode`
command and its tools, built on the library and never imported by it.
"""

from ._auth import AuthenticationFailed, Authenticator, PrincipalKey, bearer_token
from ._cache import CachedResponse
from ._errors import ConfigError, WSModeError
from ._gc import GC_THRESHOLD, tune_gc
from ._limits import Limits
from ._middleware import WebSocketModeMiddleware, find_middlewares
from ._settings import FullContext, HandshakeHeaders, ResponseHook
from ._stats import Stats
from ._store import MemoryStore, QuotaExceeded, ResponseStore, StoredResponse
from ._tap import Usage
from ._tokens import Renderer, Tokens
from ._turn import Turn, turn

__all__ = [
    "GC_THRESHOLD",
    "AuthenticationFailed",
    "Authenticator",
    "CachedResponse",
    "ConfigError",
    "FullContext",
    "HandshakeHeaders",
    "Limits",
    "MemoryStore",
    "PrincipalKey",
    "QuotaExceeded",
    "Renderer",
    "ResponseHook",
    "ResponseStore",
    "Stats",
    "StoredResponse",
    "Tokens",
    "Turn",
    "Usage",
    "WSModeError",
    "WebSocketModeMiddleware",
    "__version__",
    "bearer_token",
    "find_middlewares",
    "tune_gc",
    "turn",
]

__version__ = "0.2.0.dev0"
