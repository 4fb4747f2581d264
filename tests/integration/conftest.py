"""Fixtures: one server per ASGI server implementation for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.apps import create_app
from tests.integration.clients import Server, new_tag
from tests.servers import SERVERS, serve


@pytest.fixture(scope="session", params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The integration app under a real server; every scenario runs on each server."""
    app = create_app()
    # No pings from hypercorn here: its ping task keeps a closed connection's tasks until its
    # next ping, which the leak checks would count, and with pings every half second under
    # load a frame sent right before the app's close was seen lost now and then.
    options = {"websocket_ping_interval": None} if request.param == "hypercorn" else {}
    with serve(app.asgi, request.param, **options) as base_url:
        yield Server(name=request.param, base_url=base_url, recorder=app.recorder)


@pytest.fixture
def tag() -> str:
    """A tag of this test's calls in the recorder (`metadata.tag`)."""
    return new_tag()
