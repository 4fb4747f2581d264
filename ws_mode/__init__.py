"""OpenAI's Responses API WebSocket mode for any HTTP Responses server, as ASGI middleware.

from ws_mode import WebSocketModeMiddleware
app.add_middleware(WebSocketModeMiddleware)
"""

from .cache import CachedResponse
from .errors import ConfigError, WSModeError
from .limits import Limits
from .middleware import ResponseHook, WebSocketModeMiddleware
from .tokens import Renderer, Tokens
from .turn import Turn, turn

__all__ = [
    "CachedResponse",
    "ConfigError",
    "Limits",
    "Renderer",
    "ResponseHook",
    "Tokens",
    "Turn",
    "WSModeError",
    "WebSocketModeMiddleware",
    "__version__",
    "turn",
]

__version__ = "0.1.0"
