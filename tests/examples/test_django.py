"""The example Django project's idioms on a real server: the `authenticate` hook that finds the
handshake's user with Django's own session auth (through the ORM, off the event loop), and
ws_mode inside Channels' `ProtocolTypeRouter`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import OpenAI
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as websocket

from tests.examples import django_env
from tests.integration.clients import completed_response, sdk_until_terminal
from tests.servers import serve
from ws_mode.testing._client import connect

QUESTION = {"role": "user", "content": "Hello there"}


@dataclass
class Site:
    base_url: str
    cookie: str  # a logged-in session of alice
    logged_out: str  # a session that logged out


def session_cookie(user: Any, *, logout: bool = False) -> str:
    """The `Cookie` header of a session `user` logged in with (then out of, with `logout`)."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    if logout:
        client.logout()
    return cookie


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    django_env.setup()
    from django.contrib.auth import get_user_model
    from django_site.asgi import application

    users = get_user_model().objects
    users.filter(username__in=["alice", "bob"]).delete()
    alice = users.create_user("alice", password="not-used")
    bob = users.create_user("bob", password="not-used")
    cookie, logged_out = session_cookie(alice), session_cookie(bob, logout=True)
    with serve(application, lifetime=60) as base_url:
        yield Site(base_url, cookie, logged_out)


def sdk(site: Site, cookie: str | None) -> OpenAI:
    headers = {"Cookie": cookie} if cookie else {}
    return OpenAI(
        base_url=f"{site.base_url}/private/v1",
        api_key="-",
        default_headers=headers,
        max_retries=0,
        timeout=10,
    )


def test_a_logged_in_session_opens_the_socket(site: Site) -> None:
    with sdk(site, site.cookie) as client, client.responses.connect() as connection:
        connection.response.create(model="m", input=[QUESTION])
        first = completed_response(sdk_until_terminal(connection))
        connection.response.create(model="m", input="Bye", previous_response_id=first.id)
        second = completed_response(sdk_until_terminal(connection))
    # The user is the socket's principal, found once, at the handshake.
    assert first.output_text == "You said 'alice: Hello there'. Context: 1 items, 2 words."
    assert second.output_text.startswith("You said 'alice: Bye'. Context: 3 items")


@pytest.mark.parametrize("who", ["no session", "logged out"])
def test_the_handshake_is_refused_without_a_logged_in_session(site: Site, who: str) -> None:
    cookie = None if who == "no session" else site.logged_out
    headers = {"Cookie": cookie} if cookie else None
    with (
        pytest.raises(InvalidStatus) as refused,
        connect(site.base_url, "/private/v1/responses", headers=headers, open_timeout=10),
    ):
        pass
    assert refused.value.response.status_code == 401
    assert b"session" in refused.value.response.body


def test_plain_http_uses_the_same_sessions(site: Site) -> None:
    with sdk(site, site.cookie) as client:
        response = client.responses.create(model="m", input=[QUESTION])
    assert response.output_text.startswith("You said 'alice: Hello there'.")
    url = site.base_url + "/private/v1/responses"
    anonymous = httpx.post(url, json={"model": "m", "input": "Hi"}, timeout=10)
    assert anonymous.status_code == 401


# Channels' ProtocolTypeRouter, for projects that already use Channels.


@pytest.fixture(scope="module")
def channels_site() -> Iterator[str]:
    pytest.importorskip("channels")
    django_env.setup()
    from django_site.channels_asgi import application

    with serve(application, lifetime=60) as base_url:
        yield base_url


def test_channels_routes_the_socket_to_ws_mode(channels_site: str) -> None:
    with OpenAI(base_url=channels_site + "/v1", api_key="-", max_retries=0, timeout=10) as client:
        with client.responses.connect() as connection:
            connection.response.create(model="m", input=[QUESTION])
            first = completed_response(sdk_until_terminal(connection))
            connection.response.create(model="m", input="Bye", previous_response_id=first.id)
            second = completed_response(sdk_until_terminal(connection))
        # Plain HTTP, through the router's "http" branch, with the whole history.
        history: list[Any] = [QUESTION]
        answers = [client.responses.create(model="m", input=history).output_text]
        history += [item.to_dict() for item in first.output]
        history.append({"role": "user", "content": "Bye"})
        answers.append(client.responses.create(model="m", input=history).output_text)
    assert [first.output_text, second.output_text] == answers
    assert first.output_text == "You said 'Hello there'. Context: 1 items, 2 words."


def test_channels_consumers_keep_their_paths(channels_site: str) -> None:
    url = "ws://" + channels_site.removeprefix("http://") + "/ws/echo/"
    with websocket(url, open_timeout=10) as echo:
        echo.send("ping")
        assert echo.recv(timeout=10) == "echo: ping"
