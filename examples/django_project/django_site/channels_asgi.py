"""The ASGI application of a project that already uses Django Channels.

Channels' `ProtocolTypeRouter` routes as before. Its `websocket` branch gives `/v1/responses` to
ws_mode, which wraps Django's own HTTP application: each turn of the socket reaches the
stateless view as an ordinary `POST`, exactly as without Channels. The project's consumers keep
their paths; plain HTTP goes to Django untouched.

Run from examples/django_project (needs `pip install channels`):
    uvicorn django_site.channels_asgi:application --ws-max-size 68157440
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")

# As Channels asks: set Django up before importing consumers and routing that use the ORM.
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402
from responses_app.consumers import EchoConsumer  # noqa: E402

from ws_mode import WebSocketModeMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_application,
        "websocket": URLRouter(
            [
                # WebSocket mode: each turn calls Django's HTTP application, not a consumer.
                path("v1/responses", WebSocketModeMiddleware(django_application)),
                path("ws/echo/", EchoConsumer.as_asgi()),  # the project's own consumers
            ]
        ),
    }
)
