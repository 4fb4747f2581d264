"""Tests of the reference Responses server and its scripted model."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import re
import time
import typing
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel
from starlette.testclient import TestClient

from ws_mode.cache import CachedResponse
from ws_mode.reference import (
    ReferenceConfig,
    ReferenceStats,
    ReferenceTokenizer,
    context_digest,
    create_app,
    render_items,
    script,
)
from ws_mode.reference.model import output_tokens, text_deltas, tool_calls_since_user
from ws_mode.turn import Turn

# The SDK's event union has no pydantic discriminator: pick each event's model by its type.
STREAM_EVENTS: dict[str, type[BaseModel]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
USER: dict[str, Any] = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS: list[dict[str, Any]] = [
    {"type": "web_search"},
    {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    {"type": "function", "name": "second", "parameters": {"type": "object"}},
]


def call_output(item: dict[str, Any], output: str = "sunny") -> dict[str, Any]:
    """The client's answer to a function_call item."""
    return {"type": "function_call_output", "call_id": item["call_id"], "output": output}


def parse_sse(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Split an SSE body into (event name, decoded data) pairs, strictly."""
    assert body.endswith(b"\n\n")
    events = []
    for block in body.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2, block
        assert lines[0].startswith("event: ")
        assert lines[1].startswith("data: ")
        events.append((lines[0][len("event: ") :], orjson.loads(lines[1][len("data: ") :])))
    return events


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(ReferenceConfig(tool_calls=2, answer_tokens=12))) as test_client:
        yield test_client


# --- the scripted model -------------------------------------------------------------------


def test_script_calls_tools_then_answers() -> None:
    config = ReferenceConfig(tool_calls=3, answer_tokens=10)
    context: list[dict[str, Any]] = [USER]
    for step in range(1, 4):
        (item,) = script(context, "Be brief.", TOOLS, config)
        assert item["type"] == "function_call"
        assert item["name"] == "get_weather"
        assert item["status"] == "completed"
        digest = context_digest(context, "Be brief.", TOOLS)
        assert item["id"] == f"fc_{digest}"
        assert item["call_id"] == f"call_{digest}"
        assert orjson.loads(item["arguments"]) == {"step": step, "context_digest": digest}
        context = [*context, item, call_output(item)]
    (answer,) = script(context, "Be brief.", TOOLS, config)
    digest = context_digest(context, "Be brief.", TOOLS)
    assert answer["type"] == "message"
    assert answer["role"] == "assistant"
    assert answer["id"] == f"msg_{digest}"
    (part,) = answer["content"]
    assert part["type"] == "output_text"
    assert part["annotations"] == []
    assert part["text"].startswith(f"[{digest}] answered after 3 tool calls.")
    assert len(part["text"].split(" ")) == 10


def test_count_restarts_after_a_new_user_message() -> None:
    config = ReferenceConfig(tool_calls=1)
    (first,) = script([USER], None, None, config)
    context = [USER, first, call_output(first)]
    assert script(context, None, None, config)[0]["type"] == "message"
    context = [
        *context,
        script(context, None, None, config)[0],
        {"role": "user", "content": "More"},
    ]
    (again,) = script(context, None, None, config)
    assert again["type"] == "function_call"
    assert orjson.loads(again["arguments"])["step"] == 1
    # A user message given as an explicit `type: "message"` item counts too.
    typed = [*context[:-1], {"type": "message", "role": "user", "content": "More"}]
    assert tool_calls_since_user(typed) == 0
    # Outputs before any user message count as well.
    assert tool_calls_since_user([call_output(first), call_output(first)]) == 2


def test_zero_tool_calls_answers_at_once() -> None:
    (item,) = script([USER], None, None, ReferenceConfig(tool_calls=0, answer_tokens=3))
    assert item["type"] == "message"
    assert item["content"][0]["text"] == f"[{context_digest([USER], None, None)}] answered after"


def test_tool_name_defaults_to_lookup() -> None:
    config = ReferenceConfig()
    assert script([USER], None, None, config)[0]["name"] == "lookup"
    assert script([USER], None, [{"type": "web_search"}], config)[0]["name"] == "lookup"
    assert script([USER], None, TOOLS, config)[0]["name"] == "get_weather"


def test_output_depends_on_the_whole_context() -> None:
    config = ReferenceConfig(tool_calls=5)
    base = script([USER, {"role": "user", "content": "b"}], None, None, config)
    changed_first = script(
        [{**USER, "content": "x"}, {"role": "user", "content": "b"}], None, None, config
    )
    assert base != changed_first
    assert base != script([USER, {"role": "user", "content": "b"}], "instructions", None, config)
    assert base != script([USER, {"role": "user", "content": "b"}], None, TOOLS[:1], config)
    # Key order does not matter: the digest is over canonical JSON.
    reordered = [{"content": USER["content"], "role": "user"}, {"content": "b", "role": "user"}]
    assert base == script(reordered, None, None, config)


def test_script_is_deterministic_and_pure() -> None:
    context = [USER]
    snapshot = copy.deepcopy(context)
    config = ReferenceConfig(argument_padding=10)
    assert script(context, "i", TOOLS, config) == script(copy.deepcopy(context), "i", TOOLS, config)
    assert context == snapshot


def test_argument_padding_and_answer_length() -> None:
    (item,) = script([USER], None, None, ReferenceConfig(argument_padding=100))
    arguments = orjson.loads(item["arguments"])
    assert len(arguments["padding"]) == 100
    (plain,) = script([USER], None, None, ReferenceConfig())
    assert "padding" not in orjson.loads(plain["arguments"])
    for words in (1, 6, 7, 250):
        (answer,) = script([USER], None, None, ReferenceConfig(tool_calls=0, answer_tokens=words))
        text = answer["content"][0]["text"]
        assert len(text.split(" ")) == words
        assert context_digest([USER], None, None) in text
        assert "".join(text_deltas(text)) == text


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tool_calls": -1}, "tool_calls"),
        ({"tool_calls": 1.5}, "tool_calls"),
        ({"tool_calls": True}, "tool_calls"),
        ({"answer_tokens": 0}, "answer_tokens"),
        ({"argument_padding": -3}, "argument_padding"),
        ({"tokens_per_second": -1.0}, "tokens_per_second"),
        ({"tokens_per_second": float("inf")}, "tokens_per_second"),
        ({"tokens_per_second": float("nan")}, "tokens_per_second"),
        ({"tokens_per_second": "fast"}, "tokens_per_second"),
        ({"time_to_first_token": -0.1}, "time_to_first_token"),
        ({"time_to_first_token": float("nan")}, "time_to_first_token"),
        ({"time_to_first_token": None}, "time_to_first_token"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ReferenceConfig(**kwargs)


def test_config_accepts_valid_values_and_is_frozen() -> None:
    config = ReferenceConfig(tool_calls=0, tokens_per_second=500, answer_tokens=1)
    assert config.tokens_per_second == 500
    with pytest.raises(AttributeError):
        config.tool_calls = 4  # type: ignore[misc]


def test_create_app_validates_arguments() -> None:
    with pytest.raises(ValueError, match="path"):
        create_app(path="v1/responses")
    with pytest.raises(TypeError, match="ReferenceConfig"):
        create_app({"tool_calls": 1})  # type: ignore[arg-type]


# --- hypothesis ---------------------------------------------------------------------------

text = st.text(max_size=12)
call_ids = st.text(alphabet="abc123", min_size=1, max_size=6).map(lambda s: f"call_{s}")
items = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, text),
    st.builds(
        lambda t: {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []}],
        },
        text,
    ),
    st.builds(
        lambda c, a: {"type": "function_call", "call_id": c, "name": "f", "arguments": a},
        call_ids,
        text,
    ),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": o}, call_ids, text
    ),
)


def mutate(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of `item` whose text field differs."""
    changed = copy.deepcopy(item)
    if item.get("type") == "message":
        changed["content"][0]["text"] += "!"
    elif item.get("type") == "function_call":
        changed["arguments"] += "!"
    elif item.get("type") == "function_call_output":
        changed["output"] += "!"
    else:
        changed["content"] += "!"
    return changed


@settings(max_examples=200, deadline=None)
@given(
    context=st.lists(items, max_size=12),
    data=st.data(),
    tool_calls=st.integers(0, 4),
    instructions=st.none() | text,
)
def test_script_is_a_function_of_the_whole_context(
    context: list[dict[str, Any]],
    data: st.DataObject,
    tool_calls: int,
    instructions: str | None,
) -> None:
    config = ReferenceConfig(tool_calls=tool_calls, answer_tokens=5)
    output = script(context, instructions, None, config)
    assert output == script(copy.deepcopy(context), instructions, None, config)
    (item,) = output
    expected = "function_call" if tool_calls_since_user(context) < tool_calls else "message"
    assert item["type"] == expected
    if context:
        index = data.draw(st.integers(0, len(context) - 1))
        changed = [*context[:index], mutate(context[index]), *context[index + 1 :]]
        assert script(changed, instructions, None, config) != output
        assert script(context[:index] + context[index + 1 :], instructions, None, config) != output


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
    assert data["tools"] == TOOLS
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
    assert first["store"] is False
    assert first["instructions"] is None
    assert first["max_output_tokens"] is None


def test_full_agent_loop_over_http(client: TestClient) -> None:
    context: list[dict[str, Any]] = [USER]
    kinds = []
    for _ in range(3):
        data = client.post("/v1/responses", json={"input": context}).json()
        Response.model_validate(data)
        (item,) = data["output"]
        kinds.append(item["type"])
        context = [*context, item]
        if item["type"] == "function_call":
            context.append(call_output(item))
    assert kinds == ["function_call", "function_call", "message"]
    assert "after 2 tool calls." in context[-1]["content"][0]["text"]


# --- HTTP: SSE ----------------------------------------------------------------------------

TEXT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 12,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def check_stream(body: bytes) -> list[dict[str, Any]]:
    """Check the framing and typing of every event; return the decoded events."""
    events = parse_sse(body)
    for sequence_number, (name, data) in enumerate(events):
        assert name == data["type"]
        assert data["sequence_number"] == sequence_number
        STREAM_EVENTS[name].model_validate(data)
    return [data for _, data in events]


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
    completed = events[-1]["response"]
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


# --- errors -------------------------------------------------------------------------------


def assert_error(reply: Any, code: str | None, param: str | None) -> str:
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]
    message: str = error["message"]
    return message


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
    ],
)
def test_bad_types(client: TestClient, body: dict[str, Any], param: str) -> None:
    assert_error(client.post("/v1/responses", json=body), "invalid_type", param)


def test_previous_response_id_without_a_turn(client: TestClient) -> None:
    reply = client.post("/v1/responses", json={"input": [USER], "previous_response_id": "resp_1"})
    message = assert_error(reply, "previous_response_not_found", "previous_response_id")
    assert message == "Previous response with id 'resp_1' not found."


def install_turn(monkeypatch: pytest.MonkeyPatch, found: Turn | None) -> list[object]:
    """Make `ws_mode.turn.turn` return `found`; return the arguments it gets called with."""
    calls: list[object] = []

    def fake(request_or_scope: object) -> Turn | None:
        calls.append(request_or_scope)
        return found

    # `ws_mode.turn` is also the name of a function re-exported by the package: go through
    # the module itself.
    monkeypatch.setattr(importlib.import_module("ws_mode.turn"), "turn", fake)
    return calls


def test_previous_response_id_uses_the_turn_history(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(ReferenceConfig(tool_calls=1))
    with TestClient(app) as test_client:
        first = test_client.post("/v1/responses", json={"input": [USER]}).json()
        (call,) = first["output"]
        history = [USER, call, call_output(call)]
        over_http = test_client.post("/v1/responses", json={"input": history}).json()

        # A parent without the server's artifacts (made elsewhere): the whole history is used.
        parent = CachedResponse(
            id=first["id"], response=first, input_items=[USER], output_items=[call], parent=None
        )
        found = Turn(previous=parent, new_input=[call_output(call)], full_context=False)
        calls = install_turn(monkeypatch, found)
        app.state.reference_stats.reset()
        body = {"input": [call_output(call)], "previous_response_id": first["id"]}
        raw = orjson.dumps(body)
        continued = test_client.post("/v1/responses", content=raw).json()
    assert len(calls) == 1
    assert continued["previous_response_id"] == first["id"]
    assert continued["output"] == over_http["output"]
    assert continued["usage"] == over_http["usage"]
    assert continued["output"][0]["type"] == "message"
    stats = app.state.reference_stats
    assert (stats.requests, stats.bytes_parsed, stats.items_seen, stats.resumed) == (
        1,
        len(raw),
        3,
        0,
    )
    # The turn now carries what the next one resumes from.
    assert set(found.artifacts) == {"ws_mode.reference"}


def test_turn_without_a_previous_is_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    install_turn(monkeypatch, Turn(previous=None, new_input=[USER]))
    with TestClient(create_app()) as test_client:
        reply = test_client.post(
            "/v1/responses", json={"input": [USER], "previous_response_id": "resp_2"}
        )
        assert_error(reply, "previous_response_not_found", "previous_response_id")
        # Without previous_response_id the body's input is the context, Turn or not.
        assert test_client.post("/v1/responses", json={"input": [USER]}).status_code == 200


# --- per-request override, stats, health --------------------------------------------------


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


def test_stats(client: TestClient) -> None:
    stats = client.app.state.reference_stats  # type: ignore[attr-defined]
    assert isinstance(stats, ReferenceStats)
    zero = {
        "requests": 0,
        "bytes_parsed": 0,
        "items_seen": 0,
        "tokens_rendered": 0,
        "resumed": 0,
        "cpu_seconds": 0.0,
    }
    assert stats.snapshot() == zero
    bodies = [
        orjson.dumps({"input": [USER, USER, USER]}),
        orjson.dumps({"input": "hello", "stream": True}),
        b"not json",
    ]
    for raw in bodies:
        client.post("/v1/responses", content=raw)
    assert stats.requests == 3
    assert stats.bytes_parsed == sum(len(raw) for raw in bodies)
    assert stats.items_seen == 4
    hello = {"role": "user", "content": "hello"}
    assert stats.tokens_rendered == len(render_items([USER, USER, USER, hello]))
    assert stats.resumed == 0
    assert stats.cpu_seconds > 0
    stats.reset()
    assert stats.snapshot() == zero
    assert "requests=0" in repr(stats)


def test_healthz_and_custom_path() -> None:
    with TestClient(create_app(path="/api/responses")) as test_client:
        health = test_client.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok")
        assert test_client.post("/api/responses", json={"input": "hi"}).status_code == 200
        assert test_client.post("/v1/responses", json={"input": "hi"}).status_code == 404
        assert test_client.get("/api/responses").status_code == 405


# --- pacing -------------------------------------------------------------------------------


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record every anyio.sleep the server makes (and still sleep)."""
    recorded: list[float] = []
    real: Callable[[float], Awaitable[None]] = anyio.sleep

    async def recording(delay: float) -> None:
        recorded.append(delay)
        await real(delay)

    monkeypatch.setattr(anyio, "sleep", recording)
    return recorded


def streamed_tokens(body: bytes) -> int:
    """The output tokens of a streamed response."""
    produced: int = check_stream(body)[-1]["response"]["usage"]["output_tokens"]
    return produced


def test_streaming_is_paced(sleeps: list[float]) -> None:
    config = ReferenceConfig(tool_calls=0, answer_tokens=20, tokens_per_second=200)
    with TestClient(create_app(config)) as test_client:
        started = time.monotonic()
        reply = test_client.post("/v1/responses", json={"input": "hi", "stream": True})
        elapsed = time.monotonic() - started
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
        started = time.monotonic()
        reply = test_client.post("/v1/responses", json={"input": "hi", "stream": True})
        elapsed = time.monotonic() - started
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
        started = time.monotonic()
        reply = test_client.post("/v1/responses", json={"input": "hi"})
        elapsed = time.monotonic() - started
    assert reply.status_code == 200
    produced = reply.json()["usage"]["output_tokens"]
    assert sleeps == [pytest.approx(produced / 400)]
    assert elapsed >= produced / 400


def test_time_to_first_token(sleeps: list[float]) -> None:
    config = ReferenceConfig(tool_calls=0, answer_tokens=5, time_to_first_token=0.05)
    with TestClient(create_app(config)) as test_client:
        started = time.monotonic()
        reply = test_client.post("/v1/responses", json={"input": "hi", "stream": True})
        elapsed = time.monotonic() - started
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


# --- behind the real middleware -------------------------------------------------------------


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_websocket_mode_matches_http(full_context: Literal["always", "on_miss"]) -> None:
    """Over ws_mode, each turn sends only its new items and gets what HTTP gets for the whole
    history (with on_miss, through `turn(request).history()`)."""
    from ws_mode import WebSocketModeMiddleware

    inner = create_app(ReferenceConfig(tool_calls=2, answer_tokens=5))
    app = WebSocketModeMiddleware(inner, full_context=full_context)
    new: list[dict[str, Any]] = [USER]
    history = list(new)
    previous: str | None = None
    kinds = []
    with TestClient(app) as test_client, test_client.websocket_connect("/v1/responses") as ws:
        for _ in range(3):
            create = {"type": "response.create", "input": new, "previous_response_id": previous}
            ws.send_text(orjson.dumps(create).decode())
            while (event := orjson.loads(ws.receive_text()))["type"] != "response.completed":
                assert event["type"] not in ("error", "response.failed"), event
            response = event["response"]
            assert response["previous_response_id"] == previous
            over_http = test_client.post("/v1/responses", json={"input": history}).json()
            assert response["output"] == over_http["output"]
            (item,) = response["output"]
            kinds.append(item["type"])
            previous = response["id"]
            new = [call_output(item)] if item["type"] == "function_call" else [USER]
            history = [*history, item, *new]
    assert kinds == ["function_call", "function_call", "message"]
