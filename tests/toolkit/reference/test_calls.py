"""Tool outputs checked against their calls (`ws_mode.toolkit.reference.calls`): OpenAI's 400 for an
output that answers no call, with the whole history in ``input`` and for a continuation resumed
from the cached Turn on a real socket (where the failure also drops the parent)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.servers import serve
from tests.toolkit.reference.helpers import USER, assert_error, call_output
from ws_mode import WebSocketModeMiddleware
from ws_mode._cache import CachedResponse
from ws_mode._turn import Turn
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, ReferenceTokenizer, create_app
from ws_mode.toolkit.reference.context import ARTIFACT_KEY, Saved, resume, save, stateless
from ws_mode.toolkit.reference.request import RequestError

CONFIG = ReferenceConfig(tool_calls=3, answer_tokens=8)
STRANGER = {"type": "function_call_output", "call_id": "call_unknown", "output": "?"}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(CONFIG)) as test_client:
        yield test_client


def first_call(client: TestClient) -> dict[str, Any]:
    (call,) = client.post("/v1/responses", json={"input": [USER]}).json()["output"]
    assert call["type"] == "function_call"
    return dict(call)


def test_an_output_for_no_call_is_openais_400(client: TestClient) -> None:
    reply = client.post("/v1/responses", json={"input": [USER, STRANGER]})
    message = assert_error(reply, None, "input")
    assert message == "No tool call found for function call output with call_id call_unknown."


def test_an_output_must_follow_its_call(client: TestClient) -> None:
    call = first_call(client)
    reply = client.post("/v1/responses", json={"input": [USER, call_output(call), call]})
    assert_error(reply, None, "input")
    reply = client.post("/v1/responses", json={"input": [USER, call, call_output(call)]})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("call_id", [None, "", 5])
def test_an_output_needs_a_call_id(client: TestClient, call_id: Any) -> None:
    output = {"type": "function_call_output", "call_id": call_id, "output": "x"}
    reply = client.post("/v1/responses", json={"input": [USER, output]})
    assert_error(reply, "missing_required_parameter", "input[1].call_id")


def test_an_older_call_may_be_answered(client: TestClient) -> None:
    call = first_call(client)
    context = [USER, call, USER]
    reply = client.post("/v1/responses", json={"input": [*context, call_output(call)]})
    assert reply.status_code == 200, reply.text


def test_resume_checks_new_outputs_against_open_calls_then_the_chain() -> None:
    """`resume` (the cache-aware path) refuses a stranger, takes an open call at once, and
    finds a call that is no longer open along the chain."""
    tokenizer = ReferenceTokenizer()
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
            "arguments": "{}", "status": "completed"}  # fmt: skip
    root = CachedResponse(id="resp_1", response={}, input_items=[USER], output_items=[call],
                          parent=None)  # fmt: skip
    first = Turn(previous=None, new_input=[USER], cache_aware=True)
    save(first, stateless([USER], None, tokenizer), [call], tokenizer)
    root.artifacts.update(first.artifacts)
    saved = Saved.from_artifact(root.artifacts[ARTIFACT_KEY])
    assert saved is not None
    assert saved.open_calls == ("call_1",)
    with pytest.raises(RequestError, match="call_unknown"):
        resume(Turn(previous=root, new_input=[STRANGER], full_context=False), None, tokenizer)
    answered = resume(Turn(previous=root, new_input=[call_output(call)]), None, tokenizer)
    assert answered is not None
    assert answered.open_calls == ()
    child = CachedResponse(id="resp_2", response={}, input_items=[call_output(call)],
                           output_items=[], parent=root)  # fmt: skip
    second = Turn(previous=root, new_input=[call_output(call)], cache_aware=True)
    save(second, answered, [], tokenizer)
    child.artifacts.update(second.artifacts)
    again = resume(Turn(previous=child, new_input=[call_output(call)]), None, tokenizer)
    assert again is not None  # found along the chain, not among the open calls


# --- resumed on a real socket -----------------------------------------------------------------


@pytest.fixture(scope="module")
def resumed() -> Iterator[tuple[str, Starlette]]:
    """The reference behind ``full_context="on_miss"``, and the reference app (its stats)."""
    reference = create_app(CONFIG)
    with serve(WebSocketModeMiddleware(reference, full_context="on_miss")) as base:
        yield base, reference


def test_a_resumed_continuation_checks_its_outputs(resumed: tuple[str, Starlette]) -> None:
    """Over the socket: OpenAI's error, as an error event, and the parent dropped."""
    base, _ = resumed
    with connect(base) as socket:
        socket.send({"type": "response.create", "input": [USER]})
        first = socket.receive_turn(timeout=10)[-1]["response"]
        socket.send(
            {"type": "response.create", "previous_response_id": first["id"], "input": [STRANGER]}
        )
        (error,) = socket.receive_turn(timeout=10)
        assert error["type"] == "error"
        assert error["status"] == 400
        assert error["error"]["param"] == "input"
        assert "call_unknown" in error["error"]["message"]
        # The failed continuation dropped its parent.
        call = first["output"][0]
        socket.send(
            {"type": "response.create", "previous_response_id": first["id"], "input": [call]}
        )
        (gone,) = socket.receive_turn(timeout=10)
        assert gone["error"]["code"] == "previous_response_not_found"


def test_a_resumed_continuation_finds_calls_further_back(resumed: tuple[str, Starlette]) -> None:
    """An output for a call answered before (no longer open) is found along the cached chain,
    and the answer is the one the whole history gets over HTTP."""
    base, _ = resumed
    with connect(base) as socket, TestClient(create_app(CONFIG)) as http:
        socket.send({"type": "response.create", "input": [USER]})
        first = socket.receive_turn(timeout=10)[-1]["response"]
        call = first["output"][0]
        previous, context = first["id"], [USER, call]
        for _ in range(2):  # answer it, then answer it again
            socket.send(
                {
                    "type": "response.create",
                    "previous_response_id": previous,
                    "input": [call_output(call)],
                }
            )
            terminal = socket.receive_turn(timeout=10)[-1]
            assert terminal["type"] == "response.completed", terminal
            context = [*context, call_output(call)]
            over_http = http.post("/v1/responses", json={"input": context}).json()
            assert terminal["response"]["output"] == over_http["output"]
            previous = terminal["response"]["id"]
            context = [*context, *over_http["output"]]
