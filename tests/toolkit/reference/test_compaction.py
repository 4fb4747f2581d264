"""Compaction in the reference server (`ws_mode.toolkit.reference.compaction`):
``POST /v1/responses/compact``, a compacted context read as the whole one, and
``context_management`` compacting a chain, over plain HTTP and behind the middleware on a real
socket, whole history or resumed from the cached Turn."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.servers import serve
from tests.toolkit.reference.helpers import assert_error, check_stream
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing._client import connect
from ws_mode.toolkit.http_client import HttpClient
from ws_mode.toolkit.reference import ReferenceConfig, create_app, render_items

CONFIG = ReferenceConfig(tool_calls=5, answer_tokens=12)
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": "Remember the word quartz."},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Kept. " * 80, "annotations": []}],
    },
    {"type": "message", "role": "user", "content": "Now compact."},
]
NEXT: dict[str, Any] = {"type": "message", "role": "user", "content": "Which word?"}
THRESHOLD = [{"type": "compaction", "compact_threshold": 300}]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def answer(call: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to a function call, long enough to fill the context."""
    return {"type": "function_call_output", "call_id": call["call_id"], "output": "x " * 100}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(CONFIG)) as test_client:
        yield test_client


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post("/v1/responses", json={"metadata": {"reference_tool_calls": "0"}, **body})
    assert reply.status_code == 200, reply.text
    response: dict[str, Any] = reply.json()
    return response


def compact(client: TestClient, items: list[dict[str, Any]]) -> dict[str, Any]:
    reply = client.post("/v1/responses/compact", json={"model": "m", "input": items})
    assert reply.status_code == 200, reply.text
    compacted: dict[str, Any] = reply.json()
    return compacted


# --- /responses/compact ----------------------------------------------------------------------


def test_compact_keeps_the_user_messages_then_one_compaction_item(client: TestClient) -> None:
    compacted = compact(client, HISTORY)
    assert compacted["object"] == "response.compaction"
    *users, item = compacted["output"]
    assert [part["text"] for message in users for part in message["content"]] == [
        "Remember the word quartz.",
        "Now compact.",
    ]
    assert all(message["role"] == "user" and message["id"] for message in users)
    assert item["type"] == "compaction"
    assert item["id"].startswith("cmp_")
    base64.b64decode(item["encrypted_content"], validate=True)
    # Deterministic: the same context compacts to the same items.
    assert compact(client, HISTORY)["output"] == compacted["output"]
    assert compact(client, [*HISTORY, NEXT])["output"][-1] != item


def test_a_compacted_context_is_read_as_the_whole_one(client: TestClient) -> None:
    compacted = compact(client, HISTORY)["output"]
    via_compaction = post(client, {"input": [*compacted, NEXT]})
    via_history = post(client, {"input": [*HISTORY, NEXT]})
    assert via_compaction["output"] == via_history["output"]
    # From far fewer tokens: the long assistant message is gone.
    assert via_compaction["usage"]["input_tokens"] < via_history["usage"]["input_tokens"] / 3
    # Only the latest compaction item counts: what comes before it is not read.
    again = post(client, {"input": [user("ignored"), *compacted, NEXT]})
    assert again["output"] == via_history["output"]


def test_calls_left_open_survive_compaction(client: TestClient) -> None:
    reply = client.post("/v1/responses", json={"input": [user("Look it up.")]})
    (call,) = reply.json()["output"]
    history = [user("Look it up."), call]
    compacted = compact(client, history)["output"]
    via_compaction = client.post("/v1/responses", json={"input": [*compacted, answer(call)]})
    via_history = client.post("/v1/responses", json={"input": [*history, answer(call)]})
    assert via_compaction.status_code == 200, via_compaction.text
    assert via_compaction.json()["output"] == via_history.json()["output"]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": HISTORY}, "missing_required_parameter", "model"),
        ({"model": "m", "input": 3}, "invalid_type", "input"),
        (
            {"model": "m", "previous_response_id": "resp_x", "input": []},
            "previous_response_not_found",
            "previous_response_id",
        ),
    ],
)
def test_compact_refusals(client: TestClient, body: dict[str, Any], code: str, param: str) -> None:
    assert_error(client.post("/v1/responses/compact", json=body), code, param)


@pytest.mark.parametrize("content", ["not base64!", base64.b64encode(b"{}").decode(), 7])
def test_compaction_items_the_reference_did_not_make_are_refused(
    client: TestClient, content: Any
) -> None:
    forged = {"type": "compaction", "id": "cmp_forged", "encrypted_content": content}
    reply = client.post("/v1/responses", json={"input": [forged, NEXT]})
    message = assert_error(reply, "invalid_encrypted_content", "input[0].encrypted_content")
    assert "cmp_forged" in message


# --- context_management --------------------------------------------------------------------


def test_context_management_compacts_once_the_threshold_is_reached(client: TestClient) -> None:
    plain = post(client, {"input": HISTORY})
    below = post(client, {"input": HISTORY[:1], "context_management": THRESHOLD})
    assert [item["type"] for item in below["output"]] == ["message"]
    compacted = post(client, {"input": HISTORY, "context_management": THRESHOLD})
    first, *rest = compacted["output"]
    assert first["type"] == "compaction"
    assert rest == plain["output"]  # compacted before sampling: the same answer
    # The next turn reads from the compaction item: far below the threshold, no new one.
    follow = post(
        client, {"input": [*HISTORY, *compacted["output"], NEXT], "context_management": THRESHOLD}
    )
    assert [item["type"] for item in follow["output"]] == ["message"]
    assert follow["usage"]["input_tokens"] < 300
    assert follow["output"] == post(client, {"input": [*HISTORY, *plain["output"], NEXT]})["output"]


def test_the_compaction_item_streams_first(client: TestClient) -> None:
    body = {
        "input": HISTORY,
        "context_management": THRESHOLD,
        "stream": True,
        "metadata": {"reference_tool_calls": "0"},
    }
    events = check_stream(client.post("/v1/responses", json=body).content)
    added, compacting, done = events[2], events[3], events[4]
    assert added["type"] == "response.output_item.added"
    assert done["type"] == "response.output_item.done"
    assert added["item"]["type"] == done["item"]["type"] == "compaction"
    assert added["output_index"] == done["output_index"] == 0
    # Between them, as OpenAI's: `response.compaction.compacting`, naming the item only.
    sequence_number = compacting["sequence_number"]
    assert {key: value for key, value in compacting.items() if key != "sequence_number"} == {
        "type": "response.compaction.compacting",
        "item_id": done["item"]["id"],
        "output_index": 0,
    }
    assert added["sequence_number"] < sequence_number < done["sequence_number"]
    server_events = pytest.importorskip("openai.types.responses.responses_server_event")
    server_events.ResponseCompactionWsCompacting.model_validate(compacting)
    assert events[-1]["response"]["output"][0] == done["item"]


@pytest.mark.parametrize(
    ("context_management", "code", "param"),
    [
        ({"type": "compaction"}, "invalid_type", "context_management"),
        ([{"type": "truncation"}], "invalid_value", "context_management[0].type"),
        ([{"type": "compaction", "compact_threshold": 0}], "invalid_value",
         "context_management[0].compact_threshold"),
        ([{"type": "compaction", "compact_threshold": "9"}], "invalid_type",
         "context_management[0].compact_threshold"),
    ],
)  # fmt: skip
def test_context_management_refusals(
    client: TestClient, context_management: Any, code: str, param: str
) -> None:
    body = {"input": HISTORY, "context_management": context_management}
    assert_error(client.post("/v1/responses", json=body), code, param)


# --- a compacting chain, over HTTP and on a real socket --------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """The plain reference, and the reference behind the middleware three ways."""
    apps = {
        "http": create_app(CONFIG),
        "always": WebSocketModeMiddleware(create_app(CONFIG)),
        "on_miss": WebSocketModeMiddleware(create_app(CONFIG), full_context="on_miss"),
        "rendered": WebSocketModeMiddleware(
            create_app(CONFIG), full_context="on_miss", renderer=render_items
        ),
    }
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(serve(app)) for name, app in apps.items()}


def chain_over_http(base: str) -> list[dict[str, Any]]:
    """An agent loop sending the whole history each turn, compacting as it goes."""
    context, responses = [user("Read every file.")], []
    with HttpClient(base) as client:
        for _ in range(CONFIG.tool_calls + 1):
            body = {"input": context, "context_management": THRESHOLD}
            response = client.post_json("/v1/responses", body)
            responses.append(response)
            context = [*context, *response["output"]]
            if response["output"][-1]["type"] == "function_call":
                context.append(answer(response["output"][-1]))
    return responses


def chain_over_socket(base: str) -> list[dict[str, Any]]:
    """The same loop on one socket, continuing with ``previous_response_id``."""
    new, previous, responses = [user("Read every file.")], None, []
    with connect(base) as socket:
        for _ in range(CONFIG.tool_calls + 1):
            create = {"type": "response.create", "input": new, "context_management": THRESHOLD}
            socket.send({**create, "previous_response_id": previous})
            terminal = socket.receive_turn(timeout=10)[-1]
            assert terminal["type"] == "response.completed", terminal
            response = terminal["response"]
            responses.append(response)
            last = response["output"][-1]
            new = [answer(last)] if last["type"] == "function_call" else []
            previous = response["id"]
    return responses


@pytest.mark.parametrize("mode", ["always", "on_miss", "rendered"])
def test_a_compacting_chain_answers_alike_over_http_and_the_socket(
    servers: dict[str, str], mode: str
) -> None:
    over_http = chain_over_http(servers["http"])
    kinds = [[item["type"] for item in response["output"]] for response in over_http]
    # The chain compacts when its window reaches the threshold, then reads from there.
    assert kinds == [["function_call"], ["function_call"], ["compaction", "function_call"],
                     ["function_call"], ["compaction", "function_call"], ["message"]]  # fmt: skip
    over_socket = chain_over_socket(servers[mode])
    assert [response["output"] for response in over_socket] == [r["output"] for r in over_http]
    assert [r["usage"] for r in over_socket] == [r["usage"] for r in over_http]
