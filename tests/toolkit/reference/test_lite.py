"""The request Codex sends for Responses Lite models (`use_responses_lite` in its catalog), as
Codex 0.171 sent it for gpt-6-sol: tools in an `additional_tools` input item (with an `id`,
role `developer`, Codex's tools in namespaces, `functions` first: its code-mode `exec` custom
tool, then `wait` and others), top-level `tools` absent, `parallel_tool_calls: false`,
`reasoning.context: "all_turns"`. The reference server accepts it and calls the declared
tools, over plain HTTP and over a real socket (``ws-mode serve``, whole history and
``on_miss``), where continuations carry only their new items and the tools come with the
cached context."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from openai.types.responses import Response as SDKResponse
from starlette.testclient import TestClient

from tests.integration.clients import completed_response, sdk_until_terminal
from tests.servers import serve
from tests.toolkit.reference.helpers import call_output
from ws_mode.toolkit.cli.serve import build_app

EXEC: dict[str, Any] = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
CODE_MODE_EXEC: dict[str, Any] = {"type": "custom", "name": "exec", "description": "Run code."}
FUNCTIONS: dict[str, Any] = {
    "type": "namespace",
    "name": "functions",
    "description": "",
    "tools": [CODE_MODE_EXEC, EXEC],  # a custom tool is never called: the function is
}
ADDITIONAL_TOOLS: dict[str, Any] = {
    "type": "additional_tools",
    "id": "at_01a22142-8fea-7b51-9c12-687887504590",
    "role": "developer",
    "tools": [FUNCTIONS],
}
USER: dict[str, Any] = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "List the files."}],
}
LITE: dict[str, Any] = {
    "model": "gpt-6-sol",
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "context": "all_turns"},
    "store": False,
    "metadata": {"reference_tool_calls": "2"},
}


def test_a_lite_request_calls_the_declared_tool(client: TestClient) -> None:
    answer = client.post("/v1/responses", json={**LITE, "input": [ADDITIONAL_TOOLS, USER]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    (call,) = body["output"]
    assert (call["type"], call["name"], call["namespace"]) == (
        "function_call",
        "exec_command",
        "functions",
    )
    assert body["parallel_tool_calls"] is False
    assert body["reasoning"]["context"] == "all_turns"
    SDKResponse.model_validate(body)  # the namespaced call and the reasoning context too


def test_a_flat_declared_function_is_called_without_a_namespace(client: TestClient) -> None:
    declared = {**ADDITIONAL_TOOLS, "tools": [{"type": "web_search"}, EXEC]}
    (call,) = client.post("/v1/responses", json={**LITE, "input": [declared, USER]}).json()[
        "output"
    ]
    assert call["name"] == "exec_command"
    assert "namespace" not in call


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ({**ADDITIONAL_TOOLS, "role": "user"}, "invalid_value", "input[0].role"),
        ({**ADDITIONAL_TOOLS, "tools": FUNCTIONS}, "invalid_type", "input[0].tools"),
        ({**ADDITIONAL_TOOLS, "tools": ["exec"]}, "invalid_type", "input[0].tools[0]"),
    ],
)
def test_a_malformed_additional_tools_item_is_refused(
    client: TestClient, item: dict[str, Any], code: str, param: str
) -> None:
    answer = client.post("/v1/responses", json={**LITE, "input": [item, USER]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)


@pytest.fixture(scope="module", params=["always", "on_miss"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    with serve(build_app(full_context=request.param)) as url:
        yield url + "/v1"


def test_continuations_keep_calling_the_declared_tool_over_the_socket(base: str) -> None:
    """Codex's Lite turns on one socket: the tools only in the first request's input."""
    with OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=10) as client:
        with client.responses.connect() as conn:
            conn.response.create(input=[ADDITIONAL_TOOLS, USER], **LITE)
            first = completed_response(sdk_until_terminal(conn))
            calls = [first.output[-1].model_dump(exclude_none=True)]
            conn.response.create(
                previous_response_id=first.id, input=[call_output(calls[0])], **LITE
            )
            second = completed_response(sdk_until_terminal(conn))
            calls.append(second.output[-1].model_dump(exclude_none=True))
            conn.response.create(
                previous_response_id=second.id, input=[call_output(calls[1])], **LITE
            )
            third = completed_response(sdk_until_terminal(conn))
        for call in calls:
            assert (call["type"], call["name"], call["namespace"]) == (
                "function_call",
                "exec_command",
                "functions",
            )
        assert [item.type for item in third.output] == ["message"]
        # The same answer as the whole history over plain HTTP.
        history = [ADDITIONAL_TOOLS, USER, calls[0], call_output(calls[0])]
        full = client.responses.create(input=[*history, calls[1], call_output(calls[1])], **LITE)
    assert full.output[0].model_dump() == third.output[0].model_dump()
