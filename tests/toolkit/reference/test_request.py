"""Request parsing and validation (`ws_mode.toolkit.reference.request`): OpenAI's 400 answers for
bodies it refuses, and the per-request tool-call override."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.toolkit.reference.helpers import USER, assert_error, call_output

# --- errors -------------------------------------------------------------------------------


def test_bad_json(client: TestClient) -> None:
    reply = client.post("/v1/responses", content=b'{"input": ', headers={"content-type": "x"})
    assert_error(reply, "invalid_json", None)


def test_body_must_be_an_object(client: TestClient) -> None:
    assert_error(client.post("/v1/responses", json=[USER]), "invalid_type", None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": {"role": "user"}}, "input"),
        ({"input": [USER, "text"]}, "input[1]"),
        ({"input": [USER], "tools": {"type": "function"}}, "tools"),
        ({"input": [USER], "tools": [1]}, "tools[0]"),
        ({"input": [USER], "instructions": ["x"]}, "instructions"),
        ({"input": [USER], "metadata": {"a": 1}}, "metadata.a"),
        ({"input": [USER], "stream": "yes"}, "stream"),
        ({"input": [USER], "previous_response_id": 7}, "previous_response_id"),
        ({"input": [USER], "temperature": "hot"}, "temperature"),
        ({"input": [USER], "top_p": True}, "top_p"),
        ({"input": [USER], "top_logprobs": 1.5}, "top_logprobs"),
        ({"input": [USER], "max_tool_calls": "2"}, "max_tool_calls"),
        ({"input": [USER], "service_tier": 1}, "service_tier"),
        ({"input": [USER], "prompt_cache_key": []}, "prompt_cache_key"),
        ({"input": [USER], "text": "plain"}, "text"),
        ({"input": [USER], "tool_choice": 3}, "tool_choice"),
    ],
)
def test_bad_types(client: TestClient, body: dict[str, Any], param: str) -> None:
    assert_error(client.post("/v1/responses", json=body), "invalid_type", param)


def test_per_request_tool_call_override(client: TestClient) -> None:
    def first_item(metadata: dict[str, str]) -> dict[str, Any]:
        body = {"input": [USER], "metadata": metadata}
        item: dict[str, Any] = client.post("/v1/responses", json=body).json()["output"][0]
        return item

    assert first_item({})["type"] == "function_call"
    assert first_item({"reference_tool_calls": "0"})["type"] == "message"
    context = [USER]
    for _ in range(4):  # the app's own setting (2) would have answered by now
        (item,) = client.post(
            "/v1/responses", json={"input": context, "metadata": {"reference_tool_calls": "5"}}
        ).json()["output"]
        assert item["type"] == "function_call"
        context = [*context, item, call_output(item)]
    for bad in ("x", "-1", "1.5"):
        reply = client.post(
            "/v1/responses", json={"input": [USER], "metadata": {"reference_tool_calls": bad}}
        )
        assert_error(reply, "invalid_value", "metadata.reference_tool_calls")
