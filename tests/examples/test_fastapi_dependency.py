"""`ws_mode.fastapi`: the current Turn as a FastAPI dependency, on a real server, over the socket
(the Turn) and over plain HTTP (None), in both spellings."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from openai import OpenAI

from examples.fastapi_app import answer
from tests.integration.clients import completed_response, sdk_until_terminal
from tests.servers import serve
from ws_mode import Turn, WebSocketModeMiddleware
from ws_mode.fastapi import CurrentTurn, current_turn


def describe(current: Turn | None) -> str:
    if current is None:
        return "plain HTTP"
    return f"socket turn after {current.previous_response_id}, {len(current.new_input)} new"


def create_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(WebSocketModeMiddleware, full_context="on_miss")

    @app.post("/v1/responses")
    async def annotated(request: Request, current: CurrentTurn) -> Response:
        return answer(await request.json(), describe(current))

    @app.post("/depends/v1/responses")
    async def spelled_out(
        request: Request,
        current: Turn | None = Depends(current_turn),  # noqa: B008  (FastAPI's idiom)
    ) -> Response:
        return answer(await request.json(), describe(current))

    app.add_middleware(
        WebSocketModeMiddleware, path="/depends/v1/responses", full_context="on_miss"
    )
    return app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(create_app(), lifetime=60) as url:
        yield url


@pytest.mark.parametrize("prefix", ["", "/depends"], ids=["CurrentTurn", "Depends"])
def test_the_turn_over_the_socket_and_none_over_http(base_url: str, prefix: str) -> None:
    with OpenAI(
        base_url=f"{base_url}{prefix}/v1", api_key="-", max_retries=0, timeout=10
    ) as client:
        assert client.responses.create(model="m", input="Hi").output_text == "plain HTTP"
        with client.responses.connect() as connection:
            connection.response.create(model="m", input="Hi")
            first = completed_response(sdk_until_terminal(connection))
            connection.response.create(model="m", input="Again", previous_response_id=first.id)
            second = completed_response(sdk_until_terminal(connection))
    assert first.output_text == "socket turn after None, 1 new"
    assert second.output_text == f"socket turn after {first.id}, 1 new"


def test_the_core_does_not_import_fastapi() -> None:
    """`ws_mode.fastapi` is for apps to import; `import ws_mode` never loads FastAPI."""
    script = "import sys, ws_mode; assert 'fastapi' not in sys.modules, 'fastapi imported'"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
