"""OpenAI's Responses API WebSocket mode for any HTTP Responses server, as ASGI middleware.

from ws_mode import WebSocketModeMiddleware
app.add_middleware(WebSocketModeMiddleware)
"""

from .auth import AuthenticationFailed, Authenticator, PrincipalKey, bearer_token
from .cache import CachedResponse
from .errors import ConfigError, WSModeError
from .limits import Limits
from .middleware import ResponseHook, WebSocketModeMiddleware, find_middlewares
from .tokens import Renderer, Tokens
from .turn import Turn, turn

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
