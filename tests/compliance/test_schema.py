"""The schema checks themselves can fail: each required field, each type, each kind of nested
object, taken from a valid answer of the reference server and broken one at a time."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.compliance.helpers import WEATHER_TOOL, message
from tests.compliance.schema import (
    RESPONSE,
    check_compacted,
    check_event,
    check_response,
    check_stream,
)
from tests.toolkit.reference.helpers import parse_sse
from ws_mode.toolkit.reference import ReferenceConfig, create_app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(ReferenceConfig(tool_calls=1, answer_tokens=6))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def response(client: TestClient) -> dict[str, Any]:
    body = {"input": "Hi", "tools": [WEATHER_TOOL], "metadata": {"reference_tool_calls": "0"}}
    answer: dict[str, Any] = client.post("/v1/responses", json=body).json()
    assert check_response(answer) == []
    return answer


@pytest.mark.parametrize("field", sorted(RESPONSE))
def test_every_required_field_is_checked(response: dict[str, Any], field: str) -> None:
    broken = {key: value for key, value in response.items() if key != field}
    assert f"{field}: required" in check_response(broken)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("completed_at", "soon"),
        ("top_p", None),
        ("presence_penalty", "0"),
        ("top_logprobs", 0.5),
        ("service_tier", None),
        ("store", 1),
        ("truncation", "sometimes"),
        ("tool_choice", "maybe"),
        ("object", "thing"),
    ],
)
def test_types_and_values_are_checked(response: dict[str, Any], field: str, value: Any) -> None:
    assert check_response({**response, field: value}) != []


@pytest.mark.parametrize(
    "path",
    [
        ("output", 0, "id"),
        ("output", 0, "status"),
        ("output", 0, "content", 0, "annotations"),
        ("tools", 0, "strict"),
        ("tools", 0, "description"),
        ("usage", "input_tokens_details"),
        ("usage", "output_tokens_details", "reasoning_tokens"),
        ("text", "format"),
        ("reasoning", "summary"),
    ],
)
def test_nested_fields_are_checked(response: dict[str, Any], path: tuple[Any, ...]) -> None:
    broken = copy.deepcopy(response)
    holder = broken
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    assert check_response(broken) != []


def test_streams_are_checked_event_by_event(client: TestClient) -> None:
    body = {"input": "Hi", "stream": True, "metadata": {"reference_tool_calls": "0"}}
    events = [data for _, data in parse_sse(client.post("/v1/responses", json=body).content)]
    assert check_stream(events) == []
    assert check_stream(events[:-1]) != []  # no terminal event
    created = copy.deepcopy(events[0])
    del created["response"]["prompt_cache_key"]
    assert check_event(created) != []
    delta = next(event for event in events if event["type"] == "response.output_text.delta")
    assert check_event({**delta, "item_id": None}) != []
    assert check_event({**delta, "type": "response.mystery"}) != []


def test_socket_errors_need_a_string_code() -> None:
    payload = {"type": "invalid_request_error", "code": "x", "message": "m", "param": None}
    error = {"type": "error", "status": 400, "error": payload}
    assert check_event(error, websocket=True) == []
    assert check_event({**error, "error": {**payload, "code": None}}, websocket=True) != []
    assert check_event({"type": "error", "error": error["error"]}, websocket=True) != []


def test_compacted_objects_are_checked(client: TestClient) -> None:
    body = {"model": "m", "input": [message("user", "Hi"), message("assistant", "Hello")]}
    compacted = client.post("/v1/responses/compact", json=body).json()
    assert check_compacted(compacted) == []
    assert check_compacted({**compacted, "object": "response"}) != []
    broken = copy.deepcopy(compacted)
    del broken["output"][-1]["encrypted_content"]
    assert check_compacted(broken) != []
    assert check_compacted({k: v for k, v in compacted.items() if k != "usage"}) != []
