"""Tests of client event parsing, validation and the error envelope."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai.types.responses.response_steer_failed_event import ResponseSteerFailedEvent
from openai.types.responses.responses_server_event import ResponseWsError

from tests.fresh_python import fresh_output
from ws_mode._client_events import (
    CreateEvent,
    ProcessedEvent,
    ProtocolError,
    SteerEvent,
    parse_client_event,
)
from ws_mode._logs import LOG_VALUE_CHARS
from ws_mode._protocol import (
    MAX_ID_CHARS,
    SOCKET_ONLY_FIELDS,
    encode_event,
    error_event,
)
from ws_mode._protocol import server_error as server_error_event
from ws_mode._steering import steer_failed_event, steer_input_problem

CREATE = "response.create"
STEER = "response.steer"


def parse(**data: Any) -> CreateEvent | SteerEvent:
    return parse_client_event(json.dumps(data))


def parse_create(**data: Any) -> CreateEvent:
    event = parse(type=CREATE, **data)
    assert isinstance(event, CreateEvent)
    return event


def refusal(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(text)
    return info.value


def create_refusal(**data: Any) -> ProtocolError:
    return refusal(json.dumps({"type": CREATE, **data}))


def assert_envelope(event: dict[str, Any]) -> None:
    """The nested error envelope (docs/protocol.md, "Errors"), also as the openai SDK parses it."""
    assert event["type"] == "error"
    assert isinstance(event["status"], int)
    assert set(event) <= {"type", "sequence_number", "status", "error", "stream_id"}
    assert isinstance(event["sequence_number"], int)  # clients' schemas require it
    error = event["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert isinstance(error["type"], str)
    assert isinstance(error["code"], str)
    assert isinstance(error["message"], str)
    assert error["message"]
    assert error["param"] is None or isinstance(error["param"], str)
    parsed = ResponseWsError.model_validate(orjson.loads(encode_event(event)))
    assert parsed.status == event["status"]
    assert parsed.error.code == error["code"]
    assert parsed.error.param == error["param"]
    assert parsed.stream_id == event.get("stream_id")


# --- valid creates --------------------------------------------------------------------------


def test_flat_create_keeps_every_handler_field() -> None:
    sent = {
        "type": CREATE,
        "model": "gpt-test",
        "instructions": "Be brief.",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto",
        "temperature": 0.5,
        "metadata": {"a": "b"},
        "store": False,
        "reasoning": {"effort": "low", "summary": None},
        "input": [{"role": "user", "content": "hi"}],
    }
    create = parse_client_event(json.dumps(sent))
    assert isinstance(create, CreateEvent)
    assert create.fields == {
        key: value for key, value in sent.items() if key not in ("type", "input")
    } | {"stream": True}
    assert create.new_input == [{"role": "user", "content": "hi"}]
    assert create.raw_input == sent["input"]
    assert create.tools == sent["tools"]
    assert create.previous_response_id is None
    assert create.stream_id is None
    assert create.generate is True


def test_string_input_becomes_one_user_message() -> None:
    create = parse_create(input="Hello")
    assert create.new_input == [{"role": "user", "content": "Hello"}]
    assert create.raw_input == "Hello"
    assert "input" not in create.fields


def test_absent_and_null_input() -> None:
    for create in (parse_create(), parse_create(input=None)):
        assert create.new_input == []
        assert create.raw_input is None
        assert "input" not in create.fields


def test_socket_only_fields_are_not_forwarded() -> None:
    create = parse_create(
        stream_id="lane-1",
        generate=True,
        previous_response_id="resp_1",
        input=[],
        stream=False,
        model="m",
    )
    assert create.fields == {"model": "m", "stream": True}
    assert create.stream_id == "lane-1"
    assert create.previous_response_id == "resp_1"
    assert {"type", "stream_id", "generate"} == SOCKET_ONLY_FIELDS


def test_stream_true_is_tolerated() -> None:
    assert parse_create(stream=True).fields == {"stream": True}


def test_background_false_is_forwarded() -> None:
    assert parse_create(background=False).fields == {"background": False, "stream": True}


def test_null_fields_are_accepted() -> None:
    create = parse_create(
        stream_id=None, generate=None, previous_response_id=None, tools=None, instructions=None
    )
    assert create.stream_id is None
    assert create.generate is True
    assert create.tools is None
    assert create.fields == {"tools": None, "instructions": None, "stream": True}


def test_generate_false_is_a_warm_up() -> None:
    create = parse_create(generate=False, input="warm", tools=[])
    assert create.generate is False
    assert "generate" not in create.fields
    assert create.tools == []


@pytest.mark.parametrize(
    ("options", "generate"),
    [
        ({"prewarm": True}, False),
        ({"prewarm": False}, True),
        ({"prewarm": None, "ttl": "30m"}, True),
        ({"ttl": "12h"}, True),
        ("not an object", True),  # not ws_mode's to read: the handler validates it
    ],
)
def test_prompt_cache_prewarm_overrides_generate(options: Any, generate: bool) -> None:
    # The SDKs: `prompt_cache_options.prewarm: true` prepares the prompt cache without
    # generating output, overriding `generate` to false.
    create = parse_create(generate=True, input="warm", prompt_cache_options=options)
    assert create.generate is generate
    assert create.fields["prompt_cache_options"] == options


@pytest.mark.parametrize("prewarm", ["true", 1, 0, []])
def test_a_prewarm_that_is_not_a_boolean_is_refused(prewarm: Any) -> None:
    error = create_refusal(stream_id="w", prompt_cache_options={"prewarm": prewarm})
    assert (error.code, error.param, error.stream_id) == (
        "invalid_type",
        "prompt_cache_options.prewarm",
        "w",
    )


# --- stream_id --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream_id", ["a", "A-z_0.9", "x" * 256, "...", "-", "_", "0123456789"])
def test_valid_stream_ids(stream_id: str) -> None:
    assert parse_create(stream_id=stream_id).stream_id == stream_id


@pytest.mark.parametrize(
    "stream_id",
    ["", "x" * 257, "a b", "a/b", "é", "a\n", "a\nb", "lane:1", "💬", 5, 1.5, True, [], {}],
)
def test_invalid_stream_ids(stream_id: Any) -> None:
    error = create_refusal(stream_id=stream_id, input="hi")
    assert error.code == "invalid_stream_id"
    assert error.param == "stream_id"
    assert error.status == 400
    assert error.type == "invalid_request_error"
    assert error.stream_id is None
    assert_envelope(error.event())


def test_stream_id_checked_before_other_fields() -> None:
    assert create_refusal(stream_id="", input=5).code == "invalid_stream_id"


def test_errors_after_a_valid_stream_id_carry_it() -> None:
    error = create_refusal(stream_id="main", input=5)
    assert error.code == "invalid_type"
    assert error.event()["stream_id"] == "main"
    assert_envelope(error.event())


# --- wrong types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("input", 5),
        ("input", {"role": "user", "content": "hi"}),
        ("input", ["a string item"]),
        ("input", [{"role": "user"}, 3]),
        ("input", True),
        ("tools", {"type": "function"}),
        ("tools", "web_search"),
        ("tools", [1]),
        ("previous_response_id", 1),
        ("previous_response_id", ["resp_1"]),
        ("instructions", ["Be brief."]),
        ("instructions", 1),
        ("generate", "false"),
        ("generate", 0),
        ("generate", 1),
        ("background", "true"),
        ("background", 1),
        ("stream", "true"),
        ("stream", 1),
        ("model", 4),
        ("model", ["gpt"]),
    ],
)
def test_wrong_types_are_refused_without_coercion(param: str, value: Any) -> None:
    error = create_refusal(**{param: value})
    assert error.code == "invalid_type"
    assert error.param == param
    assert error.status == 400
    assert error.type == "invalid_request_error"
    assert param in error.message
    assert_envelope(error.event())


def test_background_true_is_unsupported() -> None:
    error = create_refusal(background=True, stream_id="bg", input="hi")
    assert error.code == "unsupported_parameter"
    assert error.param == "background"
    assert error.status == 400
    assert error.event()["stream_id"] == "bg"
    assert_envelope(error.event())


# --- ids longer than any issued --------------------------------------------------------------


def test_an_id_as_long_as_any_accepted_goes_whole_into_logs_and_spans() -> None:
    assert MAX_ID_CHARS <= LOG_VALUE_CHARS


@pytest.mark.parametrize("event_type", [CREATE, STEER])
def test_ids_up_to_the_bound_are_accepted(event_type: str) -> None:
    longest = "resp_" + "x" * (MAX_ID_CHARS - 5)
    event = parse(type=event_type, previous_response_id=longest, input="hi")
    assert isinstance(event, CreateEvent | SteerEvent)
    assert event.previous_response_id == longest


@pytest.mark.parametrize("event_type", [CREATE, STEER])
@pytest.mark.parametrize("length", [MAX_ID_CHARS + 1, 8 * 1024 * 1024])
def test_a_longer_id_is_refused_on_arrival(event_type: str, length: int) -> None:
    error = refusal(
        json.dumps({"type": event_type, "stream_id": "main", "previous_response_id": "x" * length})
    )
    assert (error.code, error.param, error.status, error.type) == (
        "string_above_max_length",
        "previous_response_id",
        400,
        "invalid_request_error",
    )
    assert error.message == (
        "Invalid 'previous_response_id': string too long. Expected a string with maximum "
        f"length {MAX_ID_CHARS}, but got a string with length {length} instead."
    )
    if event_type == CREATE:  # answered in its lane's order, as other refusals of a create
        assert (error.on_lane, error.stream_id) == (True, "main")
    assert_envelope(error.event())


@settings(max_examples=100)
@given(
    event_type=st.sampled_from([CREATE, STEER]),
    previous=st.text(min_size=MAX_ID_CHARS - 3, max_size=MAX_ID_CHARS + 3)
    | st.text(max_size=MAX_ID_CHARS * 4),
)
def test_an_id_is_accepted_exactly_when_it_is_within_the_bound(
    event_type: str, previous: str
) -> None:
    event = parse_or_refuse(json.dumps({"type": event_type, "previous_response_id": previous}))
    if len(previous) <= MAX_ID_CHARS:
        assert not isinstance(event, ProtocolError)
        assert event.previous_response_id == previous
    else:
        assert isinstance(event, ProtocolError)
        assert (event.code, event.param) == ("string_above_max_length", "previous_response_id")


def test_wrong_types_are_reported_before_lengths() -> None:
    error = create_refusal(previous_response_id="x" * 1000, input=5)
    assert (error.code, error.param) == ("invalid_type", "input")


# --- frames that are not a create or a steer -------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "{", "not json", '{"type": "response.create",}', "NaN", "[1, 2", "\ud800", "'x'"]
)
def test_malformed_json(text: str) -> None:
    error = refusal(text)
    assert error.code == "invalid_json"
    assert error.param is None
    assert error.status == 400
    assert_envelope(error.event())


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("[]", "an array"),
        ('"response.create"', "a string"),
        ("1", "a number"),
        ("1.5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
    ],
)
def test_non_object_frames(text: str, shown: str) -> None:
    error = refusal(text)
    assert error.code == "invalid_event"
    assert shown in error.message
    assert_envelope(error.event())


@pytest.mark.parametrize("data", [{}, {"input": "hi"}, {"type": None}])
def test_missing_type(data: dict[str, Any]) -> None:
    error = refusal(json.dumps(data))
    assert error.code == "missing_required_parameter"
    assert error.param == "type"
    assert_envelope(error.event())


@pytest.mark.parametrize(
    "event_type",
    ["response.cancel", "RESPONSE.CREATE", "response.create ", "", "x" * 500, 1, True, [CREATE]],
)
def test_unknown_event_type(event_type: Any) -> None:
    error = refusal(json.dumps({"type": event_type}))
    assert error.code == "unknown_event_type"
    assert error.param == "type"
    assert len(error.message) < 300
    assert_envelope(error.event())


# --- steer ----------------------------------------------------------------------------------


def test_steer_is_parsed() -> None:
    steer = parse(type=STEER, previous_response_id="resp_1", input="also this")
    assert steer == SteerEvent(previous_response_id="resp_1", input="also this")


def test_steer_keeps_any_input_for_later_checks() -> None:
    steer = parse(type=STEER, previous_response_id="resp_1", input={"odd": 1})
    assert isinstance(steer, SteerEvent)
    assert steer.input == {"odd": 1}
    assert parse(type=STEER, previous_response_id="r") == SteerEvent("r", None)


def test_steer_needs_a_previous_response_id() -> None:
    error = refusal(json.dumps({"type": STEER, "input": "x"}))
    assert error.code == "missing_required_parameter"
    assert error.param == "previous_response_id"
    assert_envelope(error.event())
    error = refusal(json.dumps({"type": STEER, "previous_response_id": 7}))
    assert error.code == "invalid_type"
    assert error.param == "previous_response_id"


@pytest.mark.parametrize(
    "value",
    [
        "more",
        [{"role": "user", "content": "more"}],
        [{"type": "message", "role": "user", "content": "more"}],
        [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}],
        [
            {"role": "user", "content": "a"},
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": "data:"},
                    {"type": "input_file", "file_id": "f"},
                ],
            },
        ],
        [{"role": "user", "content": []}],
    ],
)
def test_valid_steer_input(value: Any) -> None:
    assert steer_input_problem(value) is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "empty"),
        ([], "non-empty"),
        (None, "non-empty"),
        (5, "non-empty"),
        ({"role": "user", "content": "x"}, "non-empty"),
        (["x"], "input[0] is not an object"),
        ([{"role": "user", "content": "a"}, 1], "input[1] is not an object"),
        ([{"role": "assistant", "content": "x"}], "not a user message"),
        ([{"content": "x"}], "not a user message"),
        ([{"type": "function_call_output", "role": "user", "output": "x"}], "not a user message"),
        ([{"role": "user", "content": "x", "id": "m1"}], "may only have"),
        ([{"role": "user", "content": 3}], "content must be"),
        ([{"role": "user"}], "content must be"),
        ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "content must be"),
        ([{"role": "user", "content": ["text"]}], "content must be"),
    ],
)
def test_invalid_steer_input(value: Any, words: str) -> None:
    problem = steer_input_problem(value)
    assert problem is not None
    assert words in problem


def test_steer_failed_event_validates_with_the_sdk() -> None:
    event = steer_failed_event("steering_not_supported", "resp_1", "more", "No steering here.")
    parsed = ResponseSteerFailedEvent.model_validate(orjson.loads(encode_event(event)))
    assert parsed.type == "response.steer.failed"
    assert event["error"]["code"] == "steering_not_supported"
    assert event["steer"] == {"previous_response_id": "resp_1", "input": "more"}


# --- the envelope ---------------------------------------------------------------------------


def test_error_event_shape() -> None:
    event = error_event(400, "invalid_request_error", "c", "m", param="p", stream_id="s")
    assert event == {
        "type": "error",
        "sequence_number": 0,
        "status": 400,
        "stream_id": "s",
        "error": {"type": "invalid_request_error", "code": "c", "message": "m", "param": "p"},
    }
    assert_envelope(event)
    assert "stream_id" not in error_event(400, "t", None, "m")
    assert error_event(400, "t", None, "m")["error"]["code"] == "t"  # never null


def test_server_error_shape() -> None:
    event = server_error_event("boom", stream_id="lane")
    assert event["status"] == 500
    assert event["error"]["type"] == "server_error"
    assert event["error"]["code"] == "server_error"
    assert event["stream_id"] == "lane"
    assert_envelope(event)


def test_encode_event_is_compact_json() -> None:
    event = {"type": "x", "text": "é\n"}
    text = encode_event(event)
    assert isinstance(text, str)
    assert json.loads(text) == event
    assert "\n" not in text


# --- generated frames -----------------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**64 - 1)


def json_values(*, finite: bool = True) -> st.SearchStrategy[Any]:
    """JSON values; integers stay within 64 bits (orjson reads larger ones as floats)."""
    numbers = INT64 | st.floats(allow_nan=False, allow_infinity=not finite)
    return st.recursive(
        st.none() | st.booleans() | numbers | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=15,
    )


# Built once: a strategy built inside a composite is built (and its properties worked out by
# hypothesis) again for every example, which cost more than the parsing under test.
JSON_VALUE = json_values()
ANY_JSON_VALUE = json_values(finite=False)

CREATE_KEYS = [
    "type",
    "stream_id",
    "generate",
    "background",
    "stream",
    "previous_response_id",
    "input",
    "instructions",
    "tools",
    "model",
]
EVENT_TYPE = st.sampled_from([CREATE, STEER]) | ANY_JSON_VALUE
SOME_CREATE_KEYS = st.lists(st.sampled_from(CREATE_KEYS), max_size=4)


@st.composite
def frames(draw: st.DrawFn) -> Any:
    """Any JSON value; objects often look like a create or a steer, with wrong field values."""
    value = draw(ANY_JSON_VALUE)
    if isinstance(value, dict) and draw(st.booleans()):
        value["type"] = draw(EVENT_TYPE)
        for key in draw(SOME_CREATE_KEYS):
            if key != "type":
                value[key] = draw(ANY_JSON_VALUE)
    return value


def parse_or_refuse(text: str) -> CreateEvent | SteerEvent | ProtocolError:
    """The parsed event, or the ProtocolError; any other exception propagates."""
    try:
        return parse_client_event(text)
    except ProtocolError as error:
        return error


def infinite_free(value: Any) -> bool:
    if isinstance(value, float):
        return value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(map(infinite_free, value))
    if isinstance(value, dict):
        return all(map(infinite_free, value.values()))
    return True


@settings(max_examples=200)
@given(value=frames())
def test_any_json_value_is_parsed_or_refused(value: Any) -> None:
    event = parse_or_refuse(json.dumps(value))
    if isinstance(event, ProtocolError):
        assert_envelope(event.event())
        if not infinite_free(value):
            return  # `Infinity` is not JSON.
        assert event.code != "invalid_json"
        if isinstance(value, dict):
            assert event.stream_id in (None, value.get("stream_id"))
        return
    assert isinstance(value, dict)
    if isinstance(event, SteerEvent):
        assert value["type"] == STEER
        assert event.previous_response_id == value["previous_response_id"]
        assert event.input == value.get("input")
    else:
        assert value["type"] == CREATE
        assert not value.get("background")


handler_keys = st.text(min_size=1, max_size=10).filter(lambda key: key not in CREATE_KEYS)
items = st.lists(st.dictionaries(st.text(max_size=5), JSON_VALUE, max_size=3), max_size=3)
#: The create fields ws_mode reads, each drawn or left out.
OPTIONAL_CREATE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "stream_id": st.none() | st.from_regex(r"[A-Za-z0-9_.\-]{1,256}", fullmatch=True),
    "generate": st.none() | st.booleans(),
    "background": st.none() | st.just(False),
    "stream": st.none() | st.booleans(),
    "previous_response_id": st.none() | st.text(max_size=MAX_ID_CHARS),
    "input": st.none() | st.text() | items,
    "instructions": st.none() | st.text(),
    "tools": st.none() | items,
    "model": st.none() | st.text(),
}
HANDLER_FIELDS = st.dictionaries(handler_keys, JSON_VALUE, max_size=5)


@st.composite
def valid_creates(draw: st.DrawFn) -> dict[str, Any]:
    create: dict[str, Any] = draw(HANDLER_FIELDS)
    for key, strategy in OPTIONAL_CREATE_FIELDS.items():
        if draw(st.booleans()):
            create[key] = draw(strategy)
    create["type"] = CREATE
    order = draw(st.permutations(list(create)))
    return {key: create[key] for key in order}


@settings(max_examples=150)
@given(sent=valid_creates())
def test_valid_creates_round_trip(sent: dict[str, Any]) -> None:
    create = parse_client_event(json.dumps(sent))
    assert isinstance(create, CreateEvent)
    expected = {
        key: value
        for key, value in sent.items()
        if key not in {"type", "stream_id", "generate", "input", "previous_response_id"}
    }
    expected["stream"] = True
    assert create.fields == expected
    assert create.raw_input == sent.get("input")
    raw = sent.get("input")
    if isinstance(raw, str):
        assert create.new_input == [{"role": "user", "content": raw}]
    else:
        assert create.new_input == (raw or [])
    assert create.previous_response_id == sent.get("previous_response_id")
    assert create.stream_id == sent.get("stream_id")
    assert create.generate is (sent.get("generate") is not False)
    assert create.tools == sent.get("tools")
    # What reaches the handler encodes back to the same JSON.
    assert orjson.loads(orjson.dumps(create.fields)) == expected


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@settings(max_examples=150)
@given(text=st.text() | st.text(alphabet='{}[]":,0123456789.eE+- tnrufalsNI\\'))
def test_text_that_is_not_json_is_invalid_json(text: str) -> None:
    assume(not is_json(text))
    error = refusal(text)
    assert error.code == "invalid_json"
    assert_envelope(error.event())


def test_response_processed_is_an_acknowledgement() -> None:
    """Codex acknowledges each response with `response.processed`; it needs no answer."""
    event = parse_client_event(json.dumps({"type": "response.processed", "response_id": "r"}))
    assert isinstance(event, ProcessedEvent)
    assert event.response_id == "r"


def test_a_refused_create_does_not_hold_its_frame() -> None:
    """Refusals wait on busy lanes: one must not keep the frame alive through the
    exception it was raised from."""
    error = create_refusal(input=5, stream_id="lane", padding="x" * 10_000)
    assert error.on_lane
    assert error.__context__ is None
    assert error.__cause__ is None


def test_a_create_knows_its_frame_size() -> None:
    text = json.dumps({"type": CREATE, "input": "hi"})
    event = parse_client_event(text)
    assert isinstance(event, CreateEvent)
    assert event.size == len(text)


def test_the_core_and_the_proxy_need_no_pydantic() -> None:
    """Client events are checked by hand: the middleware, its server and the proxy import and
    validate with pydantic absent (a proxy process is about 8 MiB smaller without it)."""
    code = (
        "import sys\n"
        "sys.modules['pydantic'] = None\n"
        "import ws_mode, ws_mode.proxy, ws_mode.server\n"
        "from ws_mode._client_events import ProtocolError, parse_client_event\n"
        'parse_client_event(\'{"type": "response.create", "input": "hi"}\')\n'
        "try:\n"
        '    parse_client_event(\'{"type": "response.create", "generate": 0}\')\n'
        "except ProtocolError as error:\n"
        "    print(error.code, error.param)\n"
    )
    assert fresh_output(code) == ["invalid_type", "generate"]


@pytest.mark.parametrize("length", [MAX_ID_CHARS, MAX_ID_CHARS + 1])
def test_an_interrupts_response_id_is_bounded_as_every_other_id(length: int) -> None:
    text = json.dumps({"type": "response.interrupt", "response_id": "x" * length})
    event = parse_or_refuse(text)
    if length <= MAX_ID_CHARS:
        assert not isinstance(event, ProtocolError)
        assert event.response_id == "x" * length  # type: ignore[union-attr]
    else:
        assert isinstance(event, ProtocolError)
        assert (event.code, event.param, event.status) == (
            "string_above_max_length",
            "response_id",
            400,
        )
