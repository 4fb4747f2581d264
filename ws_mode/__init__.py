"""OpenAI's Responses API WebSocket mode for any HTTP Responses server, as ASGI middleware.

from . import WebSocketModeMiddleware
app.add_middleware(WebSocketModeMiddleware)
"""

from ._auth import AuthenticationFailed, Authenticator, PrincipalKey, bearer_token
from ._cache import CachedResponse
from ._errors import ConfigError, WSModeError
from ._limits import Limits
from ._middleware import ResponseHook, WebSocketModeMiddleware, find_middlewares
from ._tokens import Renderer, Tokens
from ._turn import Turn, turn

__all__ = [
    "AuthenticationFailed",
    "Authenticator",
    "CachedResponse",
    "ConfigError",
    "Limits",
    "PrincipalKey",
    "Renderer",
    "ResponseHook",
    "Tokens",
    "Turn",
    "WSModeError",
    "WebSocketModeMiddleware",
    "__version__",
    "bearer_token",
    "find_middlewares",
    "turn",
]

__version__ = "0.1.0"
