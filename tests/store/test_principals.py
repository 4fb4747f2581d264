"""Who may read, continue and delete stored responses, and who may keep causing work on an open
socket: the principal's stable key scopes the store and counts connections; a store without an
`authenticate` hook is refused unless the operator shares it; every stateful `GET`/`DELETE`
runs the hook; with `reauthenticate_seconds=0` every frame that causes work is checked (queued
creates as they start, steers, the successors steering starts). Real uvicorn, real clients."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.client_tls import CLIENT_TLS
from tests.library.test_steering import Model
from tests.principals import Keys
from tests.servers import serve
from ws_mode import ConfigError, Limits, WebSocketModeMiddleware
from ws_mode._auth import UnkeyedPrincipal, principal_key
from ws_mode._store import MemoryStore
from ws_mode.toolkit.reference import ReferenceConfig, create_app

FIELDS: dict[str, Any] = {"model": "reference"}
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def ws(base_url: str) -> str:
    return base_url.replace("http", "ws", 1) + "/v1/responses"


def key(value: str) -> dict[str, str]:
    return {"x-api-key": value}


def turn_over(socket: ClientConnection, **fields: Any) -> dict[str, Any]:
    socket.send(json.dumps({"type": "response.create", **FIELDS, **fields}))
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=10))
        if event["type"] in TERMINAL:
            return event


def post(base_url: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(
        base_url + "/v1/responses",
        json={**FIELDS, **body},
        headers=headers,
        timeout=10,
        verify=CLIENT_TLS,
    )


def follow_up(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        for call in calls
    ]
    return outputs or [{"role": "user", "content": "Go on."}]


# --- the principal's key ----------------------------------------------------------------------


def test_stable_principals_are_their_own_keys_and_types_never_meet() -> None:
    keys = [
        principal_key("7"),
        principal_key(7),
        principal_key(uuid.UUID(int=7)),
        principal_key(("7",)),
        principal_key((7,)),
        principal_key(("a", ("b", 1))),
    ]
    assert len(set(keys)) == len(keys)
    assert principal_key("alice") == principal_key("alice") == "principal:alice"
    assert principal_key(object(), lambda _: "alice") == principal_key("alice")
    for unkeyed in (object(), None, True, ("a", object()), 1.5):
        with pytest.raises(UnkeyedPrincipal) as refused:
            principal_key(unkeyed)
        assert refused.value.status == 500
    with pytest.raises(UnkeyedPrincipal):
        principal_key("alice", lambda _: 42)  # type: ignore[arg-type, return-value]


class User:
    """A principal object with no value `__str__`: its default prints its address, which
    CPython hands to the next object once this one is freed."""

    def __init__(self, name: str) -> None:
        self.name = name


def user_of(keys: Keys) -> Any:
    async def authenticate(scope: dict[str, Any]) -> User:
        return User(await keys(scope))  # a new object on every request, as an ORM gives

    return authenticate


def test_an_object_principal_without_principal_key_is_refused_with_the_fix_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = Keys(**{"sk-a": "alice"})
    app = WebSocketModeMiddleware(
        create_app(), store=MemoryStore(), stateful_http=True, authenticate=user_of(keys)
    )
    with serve(app) as base_url, caplog.at_level(logging.ERROR, logger="ws_mode"):
        with (
            pytest.raises(InvalidStatus) as refused,
            connect(ws(base_url), additional_headers=key("sk-a")),
        ):
            pass
        assert refused.value.response.status_code == 500
        got = httpx.get(base_url + "/v1/responses/resp_x", headers=key("sk-a"), verify=CLIENT_TLS)
        assert got.status_code == 500
        assert "principal_key" not in got.text  # the caller gets a generic error
        assert post(base_url, key("sk-a"), input="Hi").status_code == 500
    advice = [r.getMessage() for r in caplog.records if "principal_key=" in r.getMessage()]
    assert len(advice) == 3  # one line per refusal, saying how to fix it
    assert "a User" in advice[0]
    assert "Return a str, int, uuid.UUID" in advice[0]


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[str, Keys]]:
    keys = Keys(**{"sk-a": "alice", "sk-b": "bob"})
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1, answer_tokens=3)),
        store=MemoryStore(),
        stateful_http=True,
        authenticate=user_of(keys),
        principal_key=lambda user: user.name,
        limits=Limits(max_connections_per_client=2),
    )
    with serve(app) as base_url:
        yield base_url, keys


def test_with_principal_key_tenants_never_see_each_others_responses(
    users: tuple[str, Keys],
) -> None:
    base_url, _ = users
    for _ in range(3):  # each round frees the objects: the next ones may reuse their addresses
        with connect(ws(base_url), additional_headers=key("sk-a")) as alice:
            mine = turn_over(alice, input="Alice's secret")["response"]
        with connect(ws(base_url), additional_headers=key("sk-b")) as bob:
            theirs = turn_over(bob, input=follow_up(mine), previous_response_id=mine["id"])
        assert theirs["error"]["code"] == "previous_response_not_found"
        url = f"{base_url}/v1/responses/{mine['id']}"
        assert httpx.get(url, headers=key("sk-b"), verify=CLIENT_TLS).status_code == 404
        assert httpx.delete(url, headers=key("sk-b"), verify=CLIENT_TLS).status_code == 404
        assert (
            httpx.get(url, headers=key("sk-a"), verify=CLIENT_TLS).json()["id"] == mine["id"]
        )  # still hers
        with connect(ws(base_url), additional_headers=key("sk-a")) as alice:
            again = turn_over(alice, input=follow_up(mine), previous_response_id=mine["id"])
        assert again["type"] == "response.completed"


def test_with_principal_key_connections_are_counted_per_tenant(users: tuple[str, Keys]) -> None:
    base_url, _ = users
    with (
        connect(ws(base_url), additional_headers=key("sk-a")),
        connect(ws(base_url), additional_headers=key("sk-a")),
    ):
        with (
            pytest.raises(InvalidStatus) as refused,
            connect(ws(base_url), additional_headers=key("sk-a")),
        ):
            pass
        assert refused.value.response.status_code == 426
        with connect(ws(base_url), additional_headers=key("sk-b")) as bob:  # another tenant
            assert turn_over(bob, input="Hi")["type"] == "response.completed"


# --- stateful HTTP: every request authorized --------------------------------------------------


@pytest.fixture(scope="module")
def tenants() -> Iterator[tuple[str, Keys]]:
    """Stateful HTTP behind an `x-api-key` hook: two keys of tenant acme, one of tenant beta."""
    keys = Keys(**{"sk-acme-1": "acme", "sk-acme-2": "acme", "sk-beta": "beta"})
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1, answer_tokens=3)),
        store=MemoryStore(),
        stateful_http=True,
        authenticate=keys,
    )
    with serve(app) as base_url:
        yield base_url, keys


def test_get_and_delete_without_valid_credentials_get_401_and_leave_the_record(
    tenants: tuple[str, Keys],
) -> None:
    base_url, _ = tenants
    stored = post(base_url, key("sk-acme-1"), input="Keep me").json()
    url = f"{base_url}/v1/responses/{stored['id']}"
    for headers in ({}, key("sk-wrong"), {"Authorization": "Bearer sk-wrong"}):
        for method in ("GET", "DELETE"):
            answer = httpx.request(method, url, headers=headers, verify=CLIENT_TLS)
            assert answer.status_code == 401, (method, headers)
            assert answer.json()["error"]["code"] == "invalid_api_key"
            assert answer.headers["www-authenticate"] == "Bearer"  # as the socket's refusal
    assert httpx.get(url, headers=key("sk-acme-1"), verify=CLIENT_TLS).json()["id"] == stored["id"]


def test_a_tenant_cannot_read_delete_or_continue_anothers_response(
    tenants: tuple[str, Keys],
) -> None:
    base_url, _ = tenants
    stored = post(base_url, key("sk-acme-1"), input="Acme's plan").json()
    url = f"{base_url}/v1/responses/{stored['id']}"
    assert httpx.get(url, headers=key("sk-beta"), verify=CLIENT_TLS).status_code == 404
    assert httpx.delete(url, headers=key("sk-beta"), verify=CLIENT_TLS).status_code == 404
    continued = post(base_url, key("sk-beta"), input="x", previous_response_id=stored["id"])
    assert continued.status_code == 400
    assert continued.json()["error"]["code"] == "previous_response_not_found"
    with connect(ws(base_url), additional_headers=key("sk-beta")) as beta:
        event = turn_over(beta, input="x", previous_response_id=stored["id"])
    assert event["error"]["code"] == "previous_response_not_found"
    # The hook's principal scopes the store, not the key: acme's other key reads it.
    assert httpx.get(url, headers=key("sk-acme-2"), verify=CLIENT_TLS).json()["id"] == stored["id"]


def test_a_revoked_key_loses_get_access_at_once(tenants: tuple[str, Keys]) -> None:
    base_url, keys = tenants
    keys.grant("sk-leaving", "gamma")
    stored = post(base_url, key("sk-leaving"), input="Mine").json()
    url = f"{base_url}/v1/responses/{stored['id']}"
    assert httpx.get(url, headers=key("sk-leaving"), verify=CLIENT_TLS).status_code == 200
    keys.revoke("sk-leaving")
    assert httpx.get(url, headers=key("sk-leaving"), verify=CLIENT_TLS).status_code == 401
    assert httpx.delete(url, headers=key("sk-leaving"), verify=CLIENT_TLS).status_code == 401
    keys.grant("sk-new", "gamma")  # the tenant's new key: the record was left in place
    assert httpx.get(url, headers=key("sk-new"), verify=CLIENT_TLS).json()["id"] == stored["id"]


def test_a_store_that_cannot_tell_callers_apart_is_refused_unless_shared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reference = create_app()
    with pytest.raises(ConfigError) as refused:
        WebSocketModeMiddleware(reference, store=MemoryStore(), stateful_http=True)
    assert "authenticate=" in str(refused.value)
    assert "shared_store=True" in str(refused.value)
    with pytest.raises(ConfigError, match="principal_key"):
        WebSocketModeMiddleware(
            reference, store=MemoryStore(), authenticate=Keys(), shared_store=True
        )
    with pytest.raises(ConfigError, match="needs an authenticate hook"):
        WebSocketModeMiddleware(
            reference, store=MemoryStore(), principal_key=str, shared_store=True
        )
    with pytest.raises(ConfigError, match="needs store="):
        WebSocketModeMiddleware(reference, shared_store=True)
    with caplog.at_level(logging.WARNING, logger="ws_mode"):
        shared = WebSocketModeMiddleware(reference, store=MemoryStore(), shared_store=True)
    assert shared.settings.shared_store
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "every caller" in warnings[0]


# --- re-authentication before every frame that causes work -----------------------------------


def steering_app(model: Model, keys: Keys) -> WebSocketModeMiddleware:
    handler = Starlette(routes=[Route("/v1/responses", model.handle, methods=["POST"])])
    return WebSocketModeMiddleware(handler, authenticate=keys, reauthenticate_seconds=0)


def until(socket: ClientConnection, kind: str) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(socket.recv(timeout=10))
        events.append(event)
        if event["type"] == kind:
            return events


def until_closed(socket: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    """The events up to the close, and its code (None: no close came)."""
    events = []
    try:
        while True:
            events.append(json.loads(socket.recv(timeout=5)))
    except ConnectionClosed as closed:
        return events, closed.rcvd.code if closed.rcvd is not None else None
    except TimeoutError:
        return events, None


def assert_refused(events: list[dict[str, Any]], code: int | None) -> None:
    """An invalid_api_key error, then the close 1008."""
    assert events, "no event before the close"
    assert events[-1]["type"] == "error", events
    assert events[-1]["error"]["code"] == "invalid_api_key"
    assert code == 1008


def test_creates_queued_before_a_revocation_do_not_run_after_it() -> None:
    model, keys = Model(), Keys(**{"sk-a": "alice"})
    with (
        serve(steering_app(model, keys)) as base_url,
        connect(ws(base_url), additional_headers=key("sk-a")) as socket,
    ):
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "first"}))
        until(socket, "response.output_item.added")  # running, held until `go`
        for n in range(5):  # queued on the same lane behind it
            socket.send(json.dumps({"type": "response.create", "model": "two", "input": f"{n}"}))
        # Answered from the receive loop once every frame before it was taken in.
        steer = {"type": "response.steer", "previous_response_id": "resp_none", "input": "x"}
        socket.send(json.dumps(steer))
        until(socket, "response.steer.failed")
        keys.revoke("sk-a")
        model.go.set()
        events, code = until_closed(socket)
    assert len(model.inputs) == 1  # none of the five queued creates reached the handler
    assert [e["type"] for e in events].count("response.completed") == 1  # the one running
    assert_refused(events, code)


def test_a_steer_after_a_revocation_is_refused_and_starts_no_successor() -> None:
    model, keys = Model(), Keys(**{"sk-a": "alice"})
    with (
        serve(steering_app(model, keys)) as base_url,
        connect(ws(base_url), additional_headers=key("sk-a")) as socket,
    ):
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "first"}))
        until(socket, "response.output_item.added")
        keys.revoke("sk-a")
        steer = {"type": "response.steer", "previous_response_id": "resp_1", "input": "more"}
        socket.send(json.dumps(steer))
        events, code = until_closed(socket)
        model.go.set()
    assert not [e for e in events if e["type"].startswith("response.steer")]
    assert len(model.inputs) == 1
    assert_refused(events, code)


def test_a_successor_a_steer_would_start_after_a_revocation_does_not_run() -> None:
    model, keys = Model(), Keys(**{"sk-a": "alice"})
    with (
        serve(steering_app(model, keys)) as base_url,
        connect(ws(base_url), additional_headers=key("sk-a")) as socket,
    ):
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "first"}))
        until(socket, "response.output_item.added")
        steer = {"type": "response.steer", "previous_response_id": "resp_1", "input": "more"}
        socket.send(json.dumps(steer))
        until(socket, "response.steer.accepted")  # accepted while the key was valid
        keys.revoke("sk-a")
        model.go.set()  # the response reaches its boundary and is cut for the steer
        events, code = until_closed(socket)
    assert len(model.inputs) == 1  # the successor never reached the handler
    kinds = [e["type"] for e in events]
    assert "response.incomplete" in kinds
    # The input accepted while the key was valid goes back, once, before the refusal.
    returned = [e for e in events if e["type"] == "response.steer.failed"]
    assert [e["steer"]["input"] for e in returned] == ["more"]
    assert returned[0]["error"]["code"] == "successor_creation_failed"
    assert kinds.index("response.steer.failed") < kinds.index("error")
    assert_refused(events, code)
