"""Tests of the Turn a handler sees and of the request body each turn sends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import Turn, WebSocketModeMiddleware, turn
from ws_mode._budget import BODY_COPIES
from ws_mode._cache import VALUE_OVERHEAD, CachedResponse, decoded_size, encode_items
from ws_mode._client_events import CreateEvent, parse_client_event
from ws_mode._frames import _parse_encoded
from ws_mode._sse import encode_sse
from ws_mode._turn import body_cost, build_body, tools_digest

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True},
    {"type": "web_search"},
]


def create(**data: Any) -> CreateEvent:
    event = parse_client_event(json.dumps({"type": "response.create", **data}))
    assert isinstance(event, CreateEvent)
    return event


def cached(
    id: str,
    parent: CachedResponse | None = None,
    *,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> CachedResponse:
    return CachedResponse(
        id=id,
        response={"id": id, "status": "completed", "output": outputs},
        input_items=inputs,
        output_items=outputs,
        parent=parent,
        tools_digest=tools_digest(tools),
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


# --- build_body -----------------------------------------------------------------------------


def test_fresh_create_forwards_a_string_input_as_sent() -> None:
    event = create(model="m", input="Hello", stream_id="lane", generate=True)
    body = orjson.loads(build_body(event, None, full_context=True))
    assert body == {"model": "m", "input": "Hello", "stream": True}
    assert body == orjson.loads(build_body(event, None, full_context=False))


def test_fresh_create_forwards_list_input_as_sent() -> None:
    items = [user("a"), {"type": "function_call_output", "call_id": "c", "output": "{}"}]
    body = orjson.loads(build_body(create(input=items, tools=TOOLS), None, full_context=True))
    assert body == {"input": items, "tools": TOOLS, "stream": True}


def test_fresh_create_without_input_has_no_input() -> None:
    body = orjson.loads(build_body(create(model="m"), None, full_context=True))
    assert body == {"model": "m", "stream": True}


def test_fresh_create_ignores_previous_response_id_when_no_parent() -> None:
    body = orjson.loads(build_body(create(input="x"), None, full_context=False))
    assert "previous_response_id" not in body


def test_continuation_with_full_context() -> None:
    root = cached("r1", inputs=[user("hi")], outputs=[assistant("hello")])
    leaf = cached("r2", root, inputs=[user("more")], outputs=[assistant("sure")])
    event = create(previous_response_id="r2", input="again", instructions="Be brief.")
    body = orjson.loads(build_body(event, leaf, full_context=True))
    assert body == {
        "instructions": "Be brief.",
        "stream": True,
        "input": [user("hi"), assistant("hello"), user("more"), assistant("sure"), user("again")],
    }
    assert "previous_response_id" not in body


def test_continuation_without_input_and_empty_nodes() -> None:
    root = cached("r1", inputs=[], outputs=[])
    body = orjson.loads(build_body(create(previous_response_id="r1"), root, full_context=True))
    assert body == {"stream": True, "input": []}


def test_continuation_uses_the_given_new_fragment() -> None:
    root = cached("r1", inputs=[user("hi")], outputs=[])
    event = create(previous_response_id="r1", input=[user("new")])
    fragment = encode_items(event.new_input)
    body = build_body(event, root, full_context=True, new_fragment=fragment)
    assert body == build_body(event, root, full_context=True)
    assert orjson.loads(body)["input"] == [user("hi"), user("new")]


@pytest.mark.parametrize(
    ("full_context", "new_input"),
    [(True, [user("new"), user("more, and more")]), (True, "a string"), (False, [user("new")])],
)
def test_body_cost_is_what_a_scan_of_the_whole_body_estimates(
    full_context: bool, new_input: Any
) -> None:
    """A body is counted without scanning its history (the nodes' `context_decoded`), yet as
    the budget's estimate of the whole body would count it (within the separators joining the
    pieces)."""
    root = cached("r1", inputs=[user("hi")] * 50, outputs=[assistant("hello, there")])
    leaf = cached("r2", root, inputs=[user("more: yes")] * 30, outputs=[assistant("sure")] * 3)
    event = create(previous_response_id="r2", input=new_input, tools=TOOLS, instructions="Hi.")
    body = build_body(event, leaf, full_context=full_context)
    scanned = BODY_COPIES * len(body) + decoded_size(body)
    counted = body_cost(body, leaf, full_context=full_context, new_items=event.items)
    assert abs(counted - scanned) <= VALUE_OVERHEAD * 8
    # Fresh chains too.
    body = build_body(event, None, full_context=True)
    counted = body_cost(body, None, full_context=True, new_items=event.items)
    assert abs(counted - BODY_COPIES * len(body) - decoded_size(body)) <= VALUE_OVERHEAD * 4


def test_a_frame_parsed_in_a_helper_brings_its_items_decoded_size_along() -> None:
    """Counted off the event loop, so a large frame's items are not scanned on it again."""
    text = json.dumps({"type": "response.create", "input": [user("x, y")] * 100})
    event = _parse_encoded(text)
    assert isinstance(event, CreateEvent)
    assert not event.items.decoded
    assert event.items.decoded_estimate == decoded_size(event.items.fragment)


def test_continuation_with_only_new_input() -> None:
    root = cached("r1", inputs=[user("hi")], outputs=[assistant("hello")])
    event = create(previous_response_id="r1", input="again", model="m")
    body = orjson.loads(build_body(event, root, full_context=False))
    assert body == {"model": "m", "stream": True, "previous_response_id": "r1", "input": "again"}
    event = create(previous_response_id="r1")
    body = orjson.loads(build_body(event, root, full_context=False))
    assert body == {"stream": True, "previous_response_id": "r1", "input": []}


def test_build_body_does_not_mutate_the_create() -> None:
    root = cached("r1", inputs=[user("hi")], outputs=[])
    event = create(previous_response_id="r1", input="x", model="m")
    before = dict(event.fields)
    for parent in (None, root):
        for full in (True, False):
            build_body(event, parent, full_context=full)
    assert event.fields == before


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
item_lists = st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=3), max_size=3)
# Keys whose types ws_mode checks itself are left out: any JSON value goes in the others.
CHECKED_KEYS = {
    *("type", "stream_id", "generate", "input", "previous_response_id", "background"),
    *("stream", "instructions", "tools", "model"),
}
field_dicts = st.dictionaries(
    st.text(max_size=8).filter(lambda key: key not in CHECKED_KEYS),
    json_values,
    max_size=4,
)


@dataclass
class Chain:
    nodes: list[CachedResponse]
    items: list[dict[str, Any]]


@st.composite
def chains(draw: st.DrawFn) -> Chain:
    parent: CachedResponse | None = None
    nodes: list[CachedResponse] = []
    items: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 5))):
        inputs, outputs = draw(item_lists), draw(item_lists)
        parent = cached(f"resp_{index}", parent, inputs=inputs, outputs=outputs)
        nodes.append(parent)
        items += inputs + outputs
    return Chain(nodes, items)


@settings(max_examples=75)  # each example draws up to five nodes of JSON items: ~15 ms
@given(
    chain=chains(),
    fields=field_dicts,
    new=st.none() | st.text(max_size=10) | item_lists,
    with_fragment=st.booleans(),
)
def test_full_context_body_is_the_chain_then_the_new_items(
    chain: Chain,
    fields: dict[str, Any],
    new: str | list[dict[str, Any]] | None,
    with_fragment: bool,
) -> None:
    leaf = chain.nodes[-1]
    sent: dict[str, Any] = {**fields, "previous_response_id": leaf.id}
    if new is not None:
        sent["input"] = new
    event = create(**sent)
    fragment = encode_items(event.new_input) if with_fragment else None
    body = orjson.loads(build_body(event, leaf, full_context=True, new_fragment=fragment))
    assert body == {**event.fields, "input": chain.items + event.new_input}
    assert body["stream"] is True
    # The handler sees the client's fields, never the socket's.
    assert {key: body[key] for key in fields} == fields

    lean = orjson.loads(build_body(event, leaf, full_context=False))
    assert lean == {
        **event.fields,
        "previous_response_id": leaf.id,
        "input": new if new is not None else [],
    }

    # An uncached parent forwarded to the handler: the client's fields and input as sent.
    forwarded = orjson.loads(build_body(event, None, full_context=False))
    assert forwarded == {
        **event.fields,
        "previous_response_id": leaf.id,
        **({"input": new} if new is not None else {}),
    }

    fresh_event = create(
        **{key: value for key, value in sent.items() if key != "previous_response_id"}
    )
    fresh = orjson.loads(build_body(fresh_event, None, full_context=True))
    assert fresh == {**event.fields, **({"input": new} if new is not None else {})}


# --- Turn -----------------------------------------------------------------------------------


def test_history_of_a_fresh_turn_is_its_input() -> None:
    new = [user("hi")]
    current = Turn(previous=None, new_input=new)
    history = current.history()
    assert history == new
    history.append(user("not kept"))
    assert current.new_input == [user("hi")]
    assert current.previous_response_id is None
    assert current.artifacts == {}


def test_history_walks_the_chain() -> None:
    root = cached("r1", inputs=[user("a")], outputs=[assistant("b")])
    leaf = cached("r2", root, inputs=[user("c")], outputs=[assistant("d")])
    current = Turn(previous=leaf, new_input=[user("e")], stream_id="s")
    assert current.history() == [user("a"), assistant("b"), user("c"), assistant("d"), user("e")]
    assert current.previous_response_id == "r2"
    assert current.stream_id == "s"
    assert "r2" in repr(current)


def test_tools_changed() -> None:
    parent = cached("r1", inputs=[], outputs=[], tools=TOOLS)
    reordered = [dict(reversed(list(tool.items()))) for tool in TOOLS]
    assert reordered == TOOLS
    assert list(reordered[0]) != list(TOOLS[0])
    same = Turn(previous=parent, new_input=[], tools_digest=tools_digest(reordered))
    assert same.tools_changed is False
    other_tools = [*TOOLS, {"type": "function", "name": "extra", "parameters": {}}]
    changed = Turn(previous=parent, new_input=[], tools_digest=tools_digest(other_tools))
    assert changed.tools_changed is True
    dropped = Turn(previous=parent, new_input=[], tools_digest=tools_digest(None))
    assert dropped.tools_changed is True
    assert Turn(previous=None, new_input=[], tools_digest=tools_digest(TOOLS)).tools_changed
    assert Turn(previous=None, new_input=[], tools_digest=None).tools_changed


def test_tools_digest() -> None:
    assert tools_digest(None) is None
    assert tools_digest([]) is None
    first = {"type": "function", "name": "f", "parameters": {"a": 1, "b": 2}}
    second = {"parameters": {"b": 2, "a": 1}, "name": "f", "type": "function"}
    assert tools_digest([first]) == tools_digest([second])
    assert tools_digest([first]) != tools_digest([{**first, "name": "g"}])
    # Tool order matters: a model sees them in order.
    assert tools_digest([first, {"type": "x"}]) != tools_digest([{"type": "x"}, first])


def test_no_tools_on_both_sides_is_not_a_change() -> None:
    parent = cached("r1", inputs=[], outputs=[], tools=None)
    assert Turn(previous=parent, new_input=[], tools_digest=tools_digest([])).tools_changed is False


# --- turn() ---------------------------------------------------------------------------------


def http_scope(extensions: dict[str, Any] | None = None) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/responses",
        "headers": [],
        "query_string": b"",
    }
    if extensions is not None:
        scope["extensions"] = extensions
    return scope


class DjangoLikeRequest:
    """Django's ASGIRequest keeps the ASGI scope on `.scope`."""

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope


def test_turn_from_a_scope() -> None:
    current = Turn(previous=None, new_input=[])
    assert turn(http_scope({"ws_mode": current})) is current


def test_turn_from_a_starlette_request() -> None:
    current = Turn(previous=None, new_input=[])
    assert turn(Request(http_scope({"ws_mode": current}))) is current
    assert turn(Request(http_scope())) is None


def test_turn_from_an_object_with_a_scope() -> None:
    current = Turn(previous=None, new_input=[])
    assert turn(DjangoLikeRequest(http_scope({"ws_mode": current}))) is current
    assert turn(DjangoLikeRequest(http_scope())) is None


@pytest.mark.parametrize(
    "extensions",
    [None, {}, {"ws_mode": None}, {"ws_mode": "not a turn"}, {"http.response.trailers": {}}],
)
def test_no_turn_for_a_plain_request(extensions: dict[str, Any] | None) -> None:
    assert turn(http_scope(extensions)) is None


def test_null_extensions() -> None:
    scope = http_scope()
    scope["extensions"] = None
    assert turn(scope) is None


@pytest.mark.parametrize("junk", [None, 42, "scope", [("type", "http")], object()])
def test_turn_refuses_junk(junk: Any) -> None:
    with pytest.raises(TypeError, match="turn\\(\\) takes"):
        turn(junk)


def test_turn_refuses_an_object_whose_scope_is_junk() -> None:
    with pytest.raises(TypeError):
        turn(DjangoLikeRequest("not a scope"))  # type: ignore[arg-type]


def test_one_fragment_join_builds_every_body() -> None:
    # The socket's full context and stateful HTTP's stored conversation both use it.
    import orjson

    from ws_mode._items import with_input

    body = with_input(b'{"model":"m"}', [b'{"a":1}', b'{"b":2},{"c":3}'])
    assert orjson.loads(body) == {"model": "m", "input": [{"a": 1}, {"b": 2}, {"c": 3}]}
    assert orjson.loads(with_input(b"{}", [])) == {"input": []}


# --- events handed as objects, through a real server ---------------------------------------------


def handed_events(response_id: str, previous: str | None) -> list[dict[str, Any]]:
    item = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi", "annotations": []}],
    }
    started = {"id": response_id, "object": "response", "status": "in_progress", "output": []}
    finished = {**started, "status": "completed", "output": [item]}
    for fields in (started, finished):
        fields.update(created_at=1, model="m", previous_response_id=previous)
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    return [
        {"type": "response.created", "sequence_number": 0, "response": started},
        {"type": "response.output_text.delta", "sequence_number": 1, **where, "delta": "hi"},
        {
            "type": "response.output_item.done",
            "sequence_number": 2,
            "output_index": 0,
            "item": item,
        },
        {"type": "response.completed", "sequence_number": 3, "response": finished},
    ]


async def objects_handler(request: Request) -> Any:
    """Hands its events as objects on a socket turn, writes them as SSE over plain HTTP."""
    body = orjson.loads(await request.body())
    current = turn(request)
    number = body.get("previous_response_id") or "none"
    events = handed_events(f"resp_after_{number}", body.get("previous_response_id"))
    if current is None:
        return StreamingResponse(
            iter([encode_sse(event) for event in events]), media_type="text/event-stream"
        )
    for event in events:
        await current.send_event(event)
    return Response(media_type="text/event-stream")


@pytest.fixture(scope="module")
def objects_server() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/responses", objects_handler, methods=["POST"])])
    with serve(WebSocketModeMiddleware(app)) as base_url:
        yield base_url


def test_events_handed_as_objects_reach_the_client_as_over_http(objects_server: str) -> None:
    over_http = httpx.post(
        objects_server + "/v1/responses", json={"model": "m", "input": "hi"}, timeout=10
    )
    http_events = [
        json.loads(line[6:]) for line in over_http.text.splitlines() if line.startswith("data: ")
    ]
    with connect(objects_server.replace("http", "ws", 1) + "/v1/responses") as socket:
        turns = []
        previous = None
        for _ in range(2):  # the second continues from the first: the cache advanced
            create = {"type": "response.create", "model": "m", "input": "hi"}
            if previous is not None:
                create["previous_response_id"] = previous
            socket.send(json.dumps(create))
            events = [json.loads(socket.recv(timeout=10)) for _ in range(4)]
            turns.append(events)
            previous = events[-1]["response"]["id"]
    assert turns[0] == http_events
    assert [event["type"] for event in turns[1]] == [event["type"] for event in http_events]
    assert turns[1][-1]["response"]["previous_response_id"] == turns[0][-1]["response"]["id"]
