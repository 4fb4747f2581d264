"""A minimal Django project serving `POST /v1/responses`, with WebSocket mode from ws_mode."""
