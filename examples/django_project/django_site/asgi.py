"""The ASGI application: Django's own, wrapped by ws_mode. No Channels, no routing config.

Run from examples/django_project:
    uvicorn django_site.asgi:application --ws-max-size 68157440

- `ws://host/v1/responses` (SDK `base_url="http://host/v1"`): every turn calls the stateless
  view with the whole context in `input`;
- `ws://host/cached/v1/responses` (SDK `base_url="http://host/cached/v1"`):
  `full_context="on_miss"`, so on a cache hit the cache-aware view gets only the new items
  and reads the rest from `ws_mode.turn(request)`;
- `ws://host/private/v1/responses`: only for logged-in users. The `authenticate` hook
  (responses_app/auth.py) finds the user of the handshake's session cookie with Django's own
  auth, and refuses the socket (401) without one. Needs the database: `python manage.py migrate`.

Plain HTTP to every path reaches the views untouched.
"""

import os

from django.core.asgi import get_asgi_application
from responses_app.auth import authenticate

from ws_mode import WebSocketModeMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")

django_application = get_asgi_application()  # calls django.setup()

application = WebSocketModeMiddleware(django_application)
application = WebSocketModeMiddleware(
    application, path="/cached/v1/responses", full_context="on_miss"
)

application = WebSocketModeMiddleware(
    application, path="/private/v1/responses", authenticate=authenticate
)
