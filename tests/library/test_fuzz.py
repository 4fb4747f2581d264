"""Bad input on a live socket: hypothesis-generated client frames against real uvicorn.

A plain `websockets` client keeps one connection open across examples and sends each example's
burst of frames (any JSON, any field types, unknown events, binary and oversized frames, invalid
stream_ids, valid and invalid creates and steers mixed). After every burst it checks that:

- every frame got exactly one answer: an error event in the nested envelope (validated with the
  openai SDK's `ResponseWsError`), a terminal response event, or a `response.steer.failed`;
  each event names the lane of the frame it answers, and nothing else arrives;
- the socket is still usable and the cache unchanged: a continuation of a response created
  before the fuzzing still resolves, on its own lane, and gets exactly the answer the reference
  model gives for the whole context.

The short run (a few hundred examples) is part of the normal suite; the long one (thousands)
runs with `--run-slow` or with `HYPOTHESIS_PROFILE=long`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses.responses_server_event import ResponseWsError
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.toolkit.reference import ReferenceConfig, create_app, render_items, script

MAX_MESSAGE = 16 * 1024
CONFIG = ReferenceConfig(tool_calls=3, answer_tokens=8)
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
    "strict": False,
}
ANCHOR_LANE = "anchor"
ANCHOR_TEXT = "What is the anchor of this connection?"
STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}\Z")
#: Lanes a connection may open (Limits.max_streams is 32, the anchor takes one); past this the
#: session reconnects so fuzzed creates on new lanes keep reaching the handler.
LANE_BUDGET = 28
RECV_TIMEOUT = 10.0
TERMINAL = frozenset(
    {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
        "response.steer.failed",
    }
)
STEER_CODES = frozenset(
    {
        "response_not_found",
        "invalid_input",
        "steering_not_supported",
        "too_many_pending_steers",
        "response_already_completed",
        "response_not_active",
        "successor_creation_failed",
    }
)
ERROR_KEYS = frozenset({"type", "status", "error", "stream_id", "sequence_number"})
# One middleware per setting, both in front of the same reference app.
PATHS = {"always": "/v1/responses", "on_miss": "/on_miss/v1/responses"}


def build_app() -> WebSocketModeMiddleware:
    limits = Limits(max_message_bytes=MAX_MESSAGE)
    inner = create_app(CONFIG)
    app = WebSocketModeMiddleware(inner, limits=limits)
    return WebSocketModeMiddleware(
        app,
        path=PATHS["on_miss"],
        handler_path="/v1/responses",
        full_context="on_miss",
        renderer=render_items,
        limits=limits,
    )


#: Keepalive pings draw from `random` in the server's and the client's threads; one that fires
#: while hypothesis draws a frame makes hypothesis warn (an error here), so neither pings.
NO_PINGS: dict[str, Any] = {"ws_ping_interval": None}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(build_app(), **NO_PINGS) as url:
        yield url


# ----------------------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Known:
    """Stands for the id of a response completed earlier on the connection (`index` into
    the pool), resolved when the frame is sent."""

    index: int


def _resolve(value: Any, pool: list[str]) -> Any:
    if isinstance(value, Known):
        return pool[value.index % len(pool)] if pool else "resp_nothing_known_yet"
    if isinstance(value, dict):
        return {key: _resolve(item, pool) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, pool) for item in value]
    return value


scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits orjson refuses the frame: invalid_json
    | st.floats()  # NaN and Infinity are not JSON: invalid_json
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
short_text = st.text(max_size=24)
valid_stream_ids = st.sampled_from(
    ["a", "b", "lane-1", "lane_2", "x.y", "Z" * 256]
) | st.from_regex(r"[A-Za-z0-9_.\-]{1,12}", fullmatch=True)
invalid_stream_ids = (
    st.sampled_from(["", " ", "a b", "ü", "lane/1", "Z" * 257, "a\n"]) | json_values
)
stream_ids = st.none() | valid_stream_ids | invalid_stream_ids
previous_ids = (
    st.none()
    | st.builds(Known, st.integers(0, 1000))
    | st.sampled_from(["resp_missing", "", "resp_" + "0" * 32])
    | short_text
    | json_values
)
user_message = st.fixed_dictionaries(
    {"role": st.just("user"), "content": short_text},
    optional={"type": st.just("message")},
)
tool_output = st.fixed_dictionaries(
    {
        "type": st.just("function_call_output"),
        "call_id": st.sampled_from(["call_x", ""]) | short_text,
        "output": short_text,
    }
)
items = user_message | tool_output | st.dictionaries(st.text(max_size=8), json_values, max_size=3)
inputs = short_text | st.lists(items, max_size=3) | json_values
tools = st.lists(st.just(TOOL) | st.dictionaries(st.text(max_size=8), json_values), max_size=2)
metadata = st.dictionaries(
    st.sampled_from(["tag", "reference_tool_calls"]) | st.text(max_size=8),
    st.sampled_from(["0", "1", "3", "-1", "x"]) | short_text,
    max_size=3,
)


def loose(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the right type, sometimes anything at all."""
    return valid | json_values


CREATE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "stream_id": stream_ids,
    "previous_response_id": previous_ids,
    "input": loose(inputs),
    "tools": loose(tools),
    "instructions": loose(st.none() | short_text),
    "model": loose(st.sampled_from(["reference", "gpt-x"])),
    "generate": loose(st.booleans()),
    "background": loose(st.just(False)) | st.just(True),
    "stream": loose(st.booleans()),
    "metadata": loose(metadata),
    "store": loose(st.booleans()),
    "parallel_tool_calls": loose(st.booleans()),
    "max_output_tokens": loose(st.integers(1, 100)),
}

creates = st.fixed_dictionaries(
    {"type": st.just("response.create")},
    optional=CREATE_FIELDS | {"unknown_field": json_values},
)
# Creates whose fields all have the right types: most of them run a real turn.
well_typed_creates = st.fixed_dictionaries(
    {"type": st.just("response.create"), "input": short_text | st.lists(items, max_size=3)},
    optional={
        "stream_id": st.none() | valid_stream_ids,
        "previous_response_id": st.none() | st.builds(Known, st.integers(0, 1000)),
        "tools": tools,
        "instructions": st.none() | short_text,
        "generate": st.booleans(),
        "metadata": metadata,
        "stream": st.booleans(),
    },
)
steers = st.fixed_dictionaries(
    {"type": st.just("response.steer")},
    optional={
        "previous_response_id": previous_ids,
        "input": inputs | st.lists(user_message, min_size=1, max_size=2),
        "stream_id": stream_ids,
    },
)
other_events = st.fixed_dictionaries(
    {"type": st.sampled_from(["response.cancel", "session.update", "", "RESPONSE.CREATE"])},
    optional={"response": json_values, "stream_id": stream_ids},
) | st.dictionaries(
    st.sampled_from(["type", "input", "stream_id", "model"]) | st.text(max_size=8),
    json_values,
    max_size=4,
)


@dataclass(frozen=True)
class Frame:
    """One client frame: `text` (a value to encode as JSON, or raw text when `raw`) or
    `data` (a binary frame); `pad` characters make a text frame oversized."""

    value: Any = None
    raw: bool = False
    data: bytes | None = None
    pad: int = 0
    ascii: bool = True


def _value_frames(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Frame]:
    return st.builds(Frame, value=values, ascii=st.booleans())


frames = st.one_of(
    _value_frames(well_typed_creates),
    _value_frames(creates),
    _value_frames(steers),
    _value_frames(other_events),
    _value_frames(json_values),
    st.builds(Frame, value=st.text(max_size=40), raw=st.just(True)),
    st.builds(Frame, data=st.binary(max_size=64)),
    st.builds(Frame, value=well_typed_creates, pad=st.integers(MAX_MESSAGE, MAX_MESSAGE + 4096)),
)
bursts = st.lists(frames, min_size=1, max_size=4)


# ----------------------------------------------------------------------------- the oracle

ANY_LANE = object()


@dataclass
class Sent:
    """A frame as sent, and what its answer must look like."""

    payload: str | bytes
    lane: Any  # the stream_id every event of its answer carries (None: none), or ANY_LANE
    code: str | None = None  # the error code it must get, when that is certain
    is_create: bool = False
    new_lane: str | None = None


def render(frame: Frame, pool: list[str]) -> Sent:
    if frame.data is not None:
        return Sent(frame.data, None, "unsupported_frame")
    if frame.raw:
        text: str = frame.value
    else:
        value = _resolve(frame.value, pool)
        if frame.pad and isinstance(value, dict):
            value = {**value, "padding": "p" * frame.pad}
        text = json.dumps(value, ensure_ascii=frame.ascii)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE:
        return Sent(text, None, "message_too_large")
    return Sent(text, *_expect(text))


def _expect(text: str) -> tuple[Any, str | None, bool, str | None]:
    """(lane, code, is_create, new lane) for a text frame within the size limit."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None, "invalid_json", False, None
    if not isinstance(data, dict):
        return None, "invalid_event", False, None
    kind = data.get("type")
    if kind is None:
        return None, "missing_required_parameter", False, None
    if kind == "response.steer":
        return ANY_LANE, None, False, None  # the target's lane, when it is known
    if kind != "response.create":
        return None, "unknown_event_type", False, None
    stream_id = data.get("stream_id")
    if stream_id is None:
        return None, None, True, None
    if not (isinstance(stream_id, str) and STREAM_ID.match(stream_id)):
        return None, "invalid_stream_id", False, None
    return stream_id, None, True, stream_id


def check_error(event: dict[str, Any]) -> None:
    """The nested error envelope (docs/protocol.md, "Errors"), as strictly as the SDK parses it."""
    parsed = ResponseWsError.model_validate(event)
    assert parsed.type == "error"
    assert set(event) <= ERROR_KEYS, event
    assert isinstance(event["status"], int), event
    assert 400 <= event["status"] <= 599, event
    error = event["error"]
    assert isinstance(error, dict), event
    assert {"type", "code", "message", "param"} <= set(error), event
    assert isinstance(error["type"], str), event
    assert error["code"] is None or isinstance(error["code"], str), event
    assert isinstance(error["message"], str), event
    assert error["message"], event
    assert error["param"] is None or isinstance(error["param"], str), event
    # Whatever a client sends, ws_mode and the reference handler answer as the client's fault.
    assert event["status"] < 500, event
    assert error["type"] == "invalid_request_error", event


def check_answer(event: dict[str, Any]) -> str | None:
    """Check one terminal event; the id of a response to remember, if any."""
    kind = event["type"]
    if kind == "error":
        check_error(event)
        return None
    if kind == "response.steer.failed":
        assert event["error"]["code"] in STEER_CODES, event
        assert isinstance(event["error"]["message"], str), event
        assert "steer" in event, event
        return None
    response = event["response"]
    assert isinstance(response["id"], str), event
    assert isinstance(response["output"], list), event
    assert kind != "response.failed", event  # the reference model never fails a turn
    return str(response["id"])


# ----------------------------------------------------------------------------- the session


def call_output(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": item["call_id"], "output": "anchor-result"}


@dataclass
class Session:
    """One long-lived connection, its anchor response, and the ids completed so far."""

    url: str
    socket: ClientConnection | None = None
    anchor: dict[str, Any] = field(default_factory=dict)
    anchor_context: list[dict[str, Any]] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    lanes: set[str] = field(default_factory=set)
    bursts: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    #: The context ``socket`` was opened in (websockets' connect() is a context manager).
    opened: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def open(self) -> None:
        self.close()
        self.socket = self.opened.enter_context(
            connect(self.url, max_size=None, open_timeout=10, close_timeout=2, ping_interval=None)
        )
        self.pool.clear()
        self.lanes = {ANCHOR_LANE}
        user = {"role": "user", "content": ANCHOR_TEXT}
        self.send({"type": "response.create", "input": ANCHOR_TEXT, "tools": [TOOL], **_lane()})
        response = self.response_on_anchor_lane()
        assert response["output"] == script([user], None, [TOOL], CONFIG)
        self.anchor = response
        self.anchor_context = [user, *response["output"]]

    def close(self) -> None:
        self.opened.close()
        self.socket = None

    def send(self, event: dict[str, Any]) -> None:
        assert self.socket is not None
        self.socket.send(json.dumps(event))

    def recv(self) -> dict[str, Any]:
        assert self.socket is not None
        frame = self.socket.recv(timeout=RECV_TIMEOUT)
        assert isinstance(frame, str), f"the server sent a binary frame: {frame!r}"
        event = json.loads(frame)
        assert isinstance(event, dict), frame
        return event

    def response_on_anchor_lane(self) -> dict[str, Any]:
        """Events of one turn on the anchor lane, nothing else in between; its response."""
        first = self.recv()
        assert first["type"] == "response.created", first
        while True:
            assert first.get("stream_id") == ANCHOR_LANE, first
            if first["type"] in TERMINAL:
                break
            first = self.recv()
        assert first["type"] == "response.completed", first
        response: dict[str, Any] = first["response"]
        return response

    def check_anchor(self) -> None:
        """The response created before the fuzzing still resolves, with its whole context."""
        new = call_output(self.anchor["output"][0])
        self.send(
            {
                "type": "response.create",
                "previous_response_id": self.anchor["id"],
                "input": [new],
                "tools": [TOOL],
                **_lane(),
            }
        )
        response = self.response_on_anchor_lane()
        assert response["previous_response_id"] == self.anchor["id"]
        assert response["output"] == script([*self.anchor_context, new], None, [TOOL], CONFIG)

    def fuzz(self, burst: list[Frame]) -> None:
        if self.socket is None or len(self.lanes) >= LANE_BUDGET:
            self.open()
        assert self.socket is not None
        sent = [render(frame, self.pool) for frame in burst]
        for item in sent:
            self.socket.send(item.payload)
            if item.new_lane is not None:
                self.lanes.add(item.new_lane)
        answers: list[dict[str, Any]] = []
        lanes: set[Any] = {item.lane for item in sent}
        while len(answers) < len(sent):
            event = self.recv()
            if ANY_LANE not in lanes:
                assert event.get("stream_id") in lanes, (event, sent)
            if event["type"] in TERMINAL:
                answers.append(event)
                response_id = check_answer(event)
                if response_id is not None:
                    self.pool.append(response_id)
                if event["type"] == "error":
                    self.codes[event["error"]["code"]] += 1
            else:
                # Events before a terminal one belong to a create that runs a turn.
                assert any(item.is_create for item in sent), (event, sent)
        match_answers(sent, answers)
        del self.pool[:-64]
        self.bursts += 1
        self.check_anchor()


def match_answers(sent: list[Sent], answers: list[dict[str, Any]]) -> None:
    """Each frame has an answer of its own: on its lane, of its kind, with the certain codes."""
    for order in itertools.permutations(answers):
        if all(fits(item, answer) for item, answer in zip(sent, order, strict=True)):
            return
    raise AssertionError(f"the answers do not match the frames: {sent} -> {answers}")


def fits(item: Sent, answer: dict[str, Any]) -> bool:
    if item.lane is not ANY_LANE and answer.get("stream_id") != item.lane:
        return False
    if item.code is not None:
        return bool(answer["type"] == "error" and answer["error"]["code"] == item.code)
    if item.is_create:
        return bool(answer["type"] != "response.steer.failed")
    return answer["type"] in ("response.steer.failed", "error")  # a steer


def _lane() -> dict[str, str]:
    return {"stream_id": ANCHOR_LANE}


@pytest.fixture(scope="module", params=sorted(PATHS))
def session(request: pytest.FixtureRequest, base_url: str) -> Iterator[Session]:
    url = base_url.replace("http", "ws", 1) + PATHS[request.param]
    fuzzing = Session(url)
    fuzzing.open()
    try:
        yield fuzzing
    finally:
        fuzzing.close()


def _examples(count: int) -> int:
    """`count`, or more when the loaded hypothesis profile asks for more (`long`)."""
    return max(count, int(settings().max_examples))


@settings(max_examples=_examples(150))
@given(burst=bursts)
def test_fuzzed_frames_are_answered_and_leave_the_socket_usable(
    session: Session, burst: list[Frame]
) -> None:
    session.fuzz(burst)


@pytest.mark.slow
@settings(max_examples=_examples(3000))
@given(burst=bursts)
def test_fuzzed_frames_long(session: Session, burst: list[Frame]) -> None:
    session.fuzz(burst)


def test_no_keepalive_ping_can_fire_during_a_draw(session: Session) -> None:
    """What made the long fuzz run flaky: neither side of the fuzzed socket sends pings."""
    session.open()
    assert session.socket is not None
    assert session.socket.ping_interval is None


def test_the_fuzzing_reaches_every_kind_of_answer(session: Session) -> None:
    """The generated frames are not all refused at the door: creates run turns on several
    lanes, continue known responses, and each kind of refusal shows up."""
    session.open()
    fixed = [
        Frame(value={"type": "response.create", "input": "hi", "stream_id": "a"}),
        Frame(value={"type": "response.create", "input": "hi", "previous_response_id": Known(0)}),
        Frame(value={"type": "response.create", "input": "hi", "generate": False}),
        Frame(value={"type": "response.steer", "previous_response_id": Known(0), "input": "go"}),
        Frame(value={"type": "response.create", "stream_id": "", "input": "hi"}),
        Frame(value={"type": "response.create", "input": "hi", "metadata": {"x": 1}}),
        Frame(value={"type": "response.create", "input": 5, "stream_id": "typed"}),
        Frame(value=[1, 2]),
        Frame(value="{", raw=True),
        Frame(data=b"\x00\x01"),
        Frame(value={"type": "response.create"}, pad=MAX_MESSAGE),
    ]
    for frame in fixed:
        session.fuzz([frame])
    assert len(session.pool) >= 3
    assert {
        "invalid_stream_id",
        "invalid_type",
        "invalid_event",
        "invalid_json",
        "unsupported_frame",
        "message_too_large",
    } <= set(session.codes)
