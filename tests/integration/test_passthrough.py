"""What reaches the wrapped app: plain HTTP unchanged, other sockets, and each turn's headers."""

from __future__ import annotations

import httpx
import pytest
from openai.types.responses import Response

from tests.client_tls import CLIENT_TLS
from tests.integration.clients import Server, completed_response, create, sdk_until_terminal


def test_plain_http_post_reaches_the_app_unchanged(server: Server, tag: str) -> None:
    body = {"model": "scripted", "input": "Hi", "metadata": {"tag": tag, "k": "0"}}
    answer = httpx.post(server.base_url + "/v1/responses", json=body, timeout=5, verify=CLIENT_TLS)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    response = Response.model_validate(answer.json())
    assert response.output_text == "Done: received 1 items."
    [call] = server.recorder.for_tag(tag)
    assert call.body == body  # nothing added, nothing removed
    assert call.turn is None  # ws_mode.turn(request) is None over plain HTTP
    assert call.lifespan_state == "lifespan"


def test_plain_http_streaming_post(server: Server, tag: str) -> None:
    body = {"model": "scripted", "input": "Hi", "stream": True, "metadata": {"tag": tag}}
    with httpx.stream(
        "POST", server.base_url + "/v1/responses", json=body, timeout=5, verify=CLIENT_TLS
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = answer.read().decode()
    blocks = [block for block in text.split("\n\n") if block]
    types = [block.split("\n")[0].removeprefix("event: ") for block in blocks]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    [call] = server.recorder.for_tag(tag)
    assert call.body == body
    assert call.turn is None


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/responses", 405),
        ("POST", "/onmiss/v1/responses", 404),
        ("GET", "/nowhere", 404),
    ],
)
def test_other_http_requests_pass_through(
    server: Server, method: str, path: str, status: int
) -> None:
    answer = httpx.request(method, server.base_url + path, json={}, timeout=5, verify=CLIENT_TLS)
    assert answer.status_code == status


def test_a_websocket_at_another_path_reaches_the_app(server: Server) -> None:
    with server.raw(path="/ws/echo") as ws:
        ws.send_text("hello")
        assert ws.ws.recv(timeout=5) == "echo: hello"


def test_trailing_slash_is_the_same_socket_path(server: Server, tag: str) -> None:
    with server.raw(path="/v1/responses/") as ws:
        ws.send(create(tag, input="Hi", meta={"k": "0"}))
        completed_response(ws.until_terminal())
    [call] = server.recorder.for_tag(tag)
    assert call.turn is not None


def test_sdk_handshake_headers_reach_every_turn(server: Server, tag: str) -> None:
    with server.connect(
        api_key="sk-integration-secret",
        extra_headers={"X-Tenant": "acme"},
    ) as conn:
        conn.response.create(model="scripted", input="Hi", metadata={"tag": tag})
        first = completed_response(sdk_until_terminal(conn))
        conn.response.create(
            model="scripted",
            input=[
                {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "1"}
            ],
            previous_response_id=first.id,
            metadata={"tag": tag},
        )
        completed_response(sdk_until_terminal(conn))
    calls = server.recorder.for_tag(tag)
    assert len(calls) == 2
    for call in calls:
        assert call.header("authorization") == ["Bearer sk-integration-secret"]
        assert call.header("x-tenant") == ["acme"]
        [user_agent] = call.header("user-agent")
        assert user_agent.startswith("OpenAI/Python")
        check_turn_headers(call)


def test_raw_handshake_headers_reach_every_turn(server: Server, tag: str) -> None:
    headers = {
        "Authorization": "Bearer raw-secret",
        "X-Custom": "custom-value",
        "Accept-Encoding": "gzip, br",
        "Accept": "application/json",
        "Cookie": "session=abc",
    }
    with server.raw(headers=headers) as ws:
        for lane in ({}, {"stream_id": "h"}):
            ws.send(create(tag, input="Hi", meta={"k": "0"}, **lane))
            completed_response(ws.until_terminal())
    calls = server.recorder.for_tag(tag)
    assert len(calls) == 2
    for call in calls:
        assert call.header("authorization") == ["Bearer raw-secret"]
        assert call.header("x-custom") == ["custom-value"]
        assert call.header("cookie") == ["session=abc"]
        check_turn_headers(call)


def check_turn_headers(call: object) -> None:
    from tests.integration.apps import Call

    assert isinstance(call, Call)
    names = [name for name, _ in call.headers]
    assert not [name for name in names if name.startswith("sec-websocket-")], names
    for dropped in ("accept-encoding", "upgrade", "connection"):
        assert dropped not in names, names
    assert call.header("content-type") == ["application/json"]
    assert call.header("accept") == ["text/event-stream"]
    assert call.header("content-length") == [str(call.body_length)]
    assert len(call.header("host")) == 1
    assert call.lifespan_state == "lifespan"  # the lifespan state reaches every turn
