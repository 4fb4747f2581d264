"""Behind a proxy that strips a prefix: the server's `root_path` reaches the handler's turns."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.apps import create_app
from tests.integration.clients import Server, completed_response, create
from tests.servers import SERVERS, serve


@pytest.fixture(scope="module", params=SERVERS)
def rooted(request: pytest.FixtureRequest) -> Iterator[Server]:
    app = create_app()
    with serve(app.asgi, request.param, root_path="/api") as base_url:
        yield Server(name=request.param, base_url=base_url, recorder=app.recorder)


def test_turns_reach_the_handler_under_the_root_path(rooted: Server, tag: str) -> None:
    with rooted.raw() as ws:
        ws.send(create(tag, input="Hi", meta={"k": "0"}))
        first = completed_response(ws.until_terminal())
        ws.send(create(tag, input="More", previous_response_id=first["id"], meta={"k": "0"}))
        completed_response(ws.until_terminal())
    calls = rooted.recorder.for_tag(tag)
    assert len(calls) == 2
    for call in calls:
        assert call.root_path == "/api"
        assert call.turn is not None
