"""The response object and its event stream (`ws_mode.toolkit.reference.response`): the JSON answer,
the SSE event sequence, and pacing like a model generating tokens."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import httpx
import pytest
from openai.types.responses import Response
from starlette.testclient import TestClient

from tests.toolkit.reference.helpers import TEXT_ORDER, TOOLS, USER, check_stream
from ws_mode.toolkit.reference import (
    ReferenceConfig,
    ReferenceTokenizer,
    create_app,
    render_items,
    script,
)
from ws_mode.toolkit.reference.model import output_tokens

# --- HTTP: JSON ---------------------------------------------------------------------------


def test_json_answer(client: TestClient) -> None:
    body = {
        "model": "gpt-test",
        "input": "What is the weather in Paris?",
        "instructions": "Be brief.",
        "tools": TOOLS,
        "metadata": {"user": "42"},
        "store": True,
        "max_output_tokens": 100,
    }
    reply = client.post("/v1/responses", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    data = reply.json()
    response = Response.model_validate(data)
    assert re.fullmatch(r"resp_[0-9a-f]{32}", response.id)
    assert data["status"] == "completed"
    assert data["object"] == "response"
    assert isinstance(data["created_at"], int)
    assert abs(data["created_at"] - time.time()) < 60
    assert data["model"] == "gpt-test"
    assert data["instructions"] == "Be brief."
    # Function tools come back as OpenAI reports them: every field, strict by default.
    assert data["tools"] == [
        TOOLS[0],
        {
            **TOOLS[1],
            "description": None,
            "parameters": {"type": "object", "additionalProperties": False},
            "strict": True,
        },
        {
            **TOOLS[2],
            "description": None,
            "parameters": {"type": "object", "additionalProperties": False},
            "strict": True,
        },
    ]
    assert data["completed_at"] >= data["created_at"]
    assert data["metadata"] == {"user": "42"}
    assert data["store"] is True
    assert data["max_output_tokens"] == 100
    assert data["previous_response_id"] is None
    assert data["tool_choice"] == "auto"
    assert data["parallel_tool_calls"] is True
    assert data["error"] is None
    assert data["output"] == script([USER], "Be brief.", TOOLS, ReferenceConfig(tool_calls=2))
    usage = data["usage"]
    # The rendered input message, then the instructions, with the reference tokenizer.
    tokenizer = ReferenceTokenizer()
    assert usage["input_tokens"] == len(render_items([USER])) + len(tokenizer.encode("Be brief."))
    assert usage["output_tokens"] == output_tokens(data["output"][0]) > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_defaults_and_random_ids(client: TestClient) -> None:
    first = client.post("/v1/responses", json={"input": [USER]}).json()
    second = client.post("/v1/responses", json={"input": [USER]}).json()
    assert first["id"] != second["id"]
    assert first["output"] == second["output"]
    assert first["model"] == "reference"
    assert first["tools"] == []
    assert first["metadata"] == {}
    assert first["store"] is True  # OpenAI's default
    assert first["instructions"] is None
    assert first["max_output_tokens"] is None
    # OpenAI's defaults for what the request left out (the Open Responses schema needs them).
    assert {key: first[key] for key in DEFAULTS} == DEFAULTS


DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "max_tool_calls": None,
    "service_tier": "default",
    "safety_identifier": None,
    "prompt_cache_key": None,
    "truncation": "disabled",
    "user": None,
    "background": False,
    "incomplete_details": None,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "reasoning": {"effort": None, "summary": None},
}


def test_request_settings_are_echoed(client: TestClient) -> None:
    settings: dict[str, Any] = {
        "temperature": 0.2,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "top_logprobs": 3,
        "max_tool_calls": 4,
        "service_tier": "flex",
        "safety_identifier": "user-7",
        "prompt_cache_key": "chat-7",
        "truncation": "auto",
        "user": "u7",
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    body = {
        **settings,
        "input": [USER],
        "text": {"verbosity": "low"},
        "reasoning": {"effort": "high"},
        "tools": [{**TOOLS[1], "strict": False, "description": "Weather."}],
    }
    data = client.post("/v1/responses", json=body).json()
    assert {key: data[key] for key in settings} == settings
    assert data["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert data["reasoning"] == {"effort": "high", "summary": None}
    # strict: false is kept, and the schema left as it came.
    assert data["tools"] == [{**TOOLS[1], "strict": False, "description": "Weather."}]
    auto = client.post("/v1/responses", json={"input": [USER], "service_tier": "auto"}).json()
    assert auto["service_tier"] == "default"


# --- HTTP: SSE ----------------------------------------------------------------------------


def test_sse_text_answer(client: TestClient) -> None:
    body = {"input": "Hi", "stream": True, "metadata": {"reference_tool_calls": "0"}}
    reply = client.post("/v1/responses", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = check_stream(reply.content)
    assert [event["type"] for event in events] == TEXT_ORDER
    created, in_progress = events[0]["response"], events[1]["response"]
    assert created["status"] == in_progress["status"] == "in_progress"
    assert created["output"] == []
    assert created["completed_at"] is None
    assert created["usage"] is None
    completed = events[-1]["response"]
    assert completed["completed_at"] >= completed["created_at"]
    response = Response.model_validate(completed)
    assert response.status == "completed"
    assert completed["id"] == created["id"]
    (item,) = completed["output"]
    added = events[2]["item"]
    assert added == {**item, "status": "in_progress", "content": []}
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": []}
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    for delta in deltas:
        assert delta["item_id"] == item["id"]
        assert delta["output_index"] == 0
        assert delta["content_index"] == 0
        assert delta["logprobs"] == []
    assert all(d["delta"].endswith(" ") for d in deltas[:-1])
    text = "".join(d["delta"] for d in deltas)
    assert text == item["content"][0]["text"] == events[-4]["text"]
    assert events[-3]["part"] == item["content"][0]
    assert events[-2]["item"] == item
    # Real tokens: the answer's text, tokenized (more tokens than words: it holds a hex digest).
    produced = completed["usage"]["output_tokens"]
    assert produced == len(ReferenceTokenizer().encode(text)) > len(deltas)
    # The stream carries the same output as the JSON answer.
    json_body = {key: value for key, value in body.items() if key != "stream"}
    assert client.post("/v1/responses", json=json_body).json()["output"] == completed["output"]


def test_sse_function_call(client: TestClient) -> None:
    app = create_app(ReferenceConfig(argument_padding=300))
    with TestClient(app) as padded:
        reply = padded.post("/v1/responses", json={"input": [USER], "stream": True})
    events = check_stream(reply.content)
    kinds = [event["type"] for event in events]
    deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert 2 <= len(deltas) <= 4
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(deltas),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (item,) = events[-1]["response"]["output"]
    assert events[2]["item"] == {**item, "arguments": "", "status": "in_progress"}
    assert "".join(d["delta"] for d in deltas) == item["arguments"] == events[-3]["arguments"]
    assert all(d["item_id"] == item["id"] and d["output_index"] == 0 for d in deltas)
    assert events[-2]["item"] == item
    Response.model_validate(events[-1]["response"])


# --- pacing -------------------------------------------------------------------------------


def streamed_tokens(body: bytes) -> int:
    """The output tokens of a streamed response."""
    produced: int = check_stream(body)[-1]["response"]["usage"]["output_tokens"]
    return produced


def timed_post(test_client: TestClient, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    """POST `body` to the app; return the reply and the seconds it took."""
    started = time.monotonic()
    reply = test_client.post("/v1/responses", json=body)
    return reply, time.monotonic() - started


def test_streaming_is_paced(sleeps: list[float]) -> None:
    config = ReferenceConfig(tool_calls=0, answer_tokens=20, tokens_per_second=200)
    with TestClient(create_app(config)) as test_client:
        reply, elapsed = timed_post(test_client, {"input": "hi", "stream": True})
    # Paced by real output tokens: more than the 20 words (the answer holds a hex digest).
    produced = streamed_tokens(reply.content)
    assert produced > 20
    assert elapsed >= produced / 200 - 0.002
    assert 10 <= len(sleeps) <= 20  # at most one sleep per delta
    # Pacing sleeps until each token is due; on a loaded machine it sleeps less to catch up,
    # never more than the schedule.
    assert sum(sleeps) <= produced / 200 + 0.002


def test_fast_rates_batch_their_sleeps(sleeps: list[float]) -> None:
    # Over 1,000 tokens at 20,000 tokens/s: 50+ ms of pacing at a 50 us interval per token.
    config = ReferenceConfig(tool_calls=0, answer_tokens=1000, tokens_per_second=20_000)
    with TestClient(create_app(config)) as test_client:
        reply, elapsed = timed_post(test_client, {"input": "hi", "stream": True})
    assert len(check_stream(reply.content)) == 1000 + 8
    produced = streamed_tokens(reply.content)
    assert produced >= 1000
    assert elapsed >= produced / 20_000 - 0.001
    # Sleeping only when at least 1 ms is owed: at most one sleep per millisecond, not per token.
    assert 1 <= len(sleeps) <= produced // 20 + 1
    assert all(delay >= 0.001 for delay in sleeps)


def test_no_delay_by_default(sleeps: list[float]) -> None:
    with TestClient(create_app(ReferenceConfig(answer_tokens=500, tool_calls=0))) as test_client:
        test_client.post("/v1/responses", json={"input": "hi", "stream": True})
        test_client.post("/v1/responses", json={"input": "hi"})
    assert sleeps == []


def test_json_answer_is_paced(sleeps: list[float]) -> None:
    config = ReferenceConfig(tool_calls=0, answer_tokens=10, tokens_per_second=400)
    with TestClient(create_app(config)) as test_client:
        reply, elapsed = timed_post(test_client, {"input": "hi"})
    assert reply.status_code == 200
    produced = reply.json()["usage"]["output_tokens"]
    assert sleeps == [pytest.approx(produced / 400)]
    assert elapsed >= produced / 400


def test_time_to_first_token(sleeps: list[float]) -> None:
    config = ReferenceConfig(tool_calls=0, answer_tokens=5, time_to_first_token=0.05)
    with TestClient(create_app(config)) as test_client:
        reply, elapsed = timed_post(test_client, {"input": "hi", "stream": True})
        # Without a rate, the only pause is before the first delta.
        assert sleeps == [pytest.approx(0.05, abs=0.002)]
        assert elapsed >= 0.05
        events = check_stream(reply.content)
        assert [e["type"] for e in events[:4]] == TEXT_ORDER[:4]
        sleeps.clear()
        assert test_client.post("/v1/responses", json={"input": "hi"}).status_code == 200
        assert sleeps == [pytest.approx(0.05)]

    sleeps.clear()
    paced = dataclasses.replace(config, tokens_per_second=1000)
    with TestClient(create_app(paced)) as test_client:
        reply = test_client.post("/v1/responses", json={"input": "hi", "stream": True})
    # The first pause is the time to first token plus the first delta's tokens.
    assert 0.05 < sleeps[0] < 0.05 + 0.02
    assert sum(sleeps) == pytest.approx(0.05 + streamed_tokens(reply.content) / 1000, abs=0.01)
