"""Applications that start wrong, for uvicorn in a child process (`tests/library/test_startup.py`):
a bad option given through `add_middleware`, a `handler_path` no route serves."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from ws_mode import MemoryStore, WebSocketModeMiddleware


async def respond(request: Request) -> JSONResponse:
    return JSONResponse({"id": "resp_1", "object": "response", "status": "completed"})


def fastapi_app(**options: Any) -> FastAPI:
    app = FastAPI()
    app.post("/v1/responses")(respond)
    app.post("/v1/other/{rest:path}")(respond)
    app.add_middleware(WebSocketModeMiddleware, **options)
    return app


#: `steering` takes True or False.
bad_value = fastapi_app(steering="yes")
#: No such option.
unknown_option = fastapi_app(steerng=False)
#: Served: the route of the default handler_path, and one with a path parameter.
served = fastapi_app()
served_by_a_path_parameter = fastapi_app(handler_path="/v1/other/responses")
#: No route serves it.
missing_route = fastapi_app(handler_path="/v1/respones")

#: A mounted sub-app may serve anything under its prefix: no false alarm.
mounted = Starlette(
    routes=[
        Mount("/api", app=Starlette(routes=[Route("/v1/responses", respond, methods=["POST"])]))
    ]
)
mounted.add_middleware(WebSocketModeMiddleware, handler_path="/api/v1/responses")
#: A store, and no way to tell whose responses are whose.
store_without_authenticate = fastapi_app(store=MemoryStore())
