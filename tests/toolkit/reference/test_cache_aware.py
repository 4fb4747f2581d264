"""The reference server behind the real middleware: over plain HTTP it works on the whole history
every turn; behind `full_context="on_miss"` it resumes from its parent's artifacts and works on
the new items only, and gives exactly the same answers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient
from starlette.testclient import WebSocketTestSession as Socket

from ws_mode import Renderer, WebSocketModeMiddleware
from ws_mode._cache import CachedResponse
from ws_mode._protocol import FAILURE_EVENTS
from ws_mode._turn import Turn
from ws_mode.toolkit.reference import (
    ReferenceConfig,
    ReferenceTokenizer,
    create_app,
    fold_items,
    render_items,
)
from ws_mode.toolkit.reference.context import ARTIFACT_KEY, Saved, resume, stateless

TURNS = 10
USER: dict[str, Any] = {"type": "message", "role": "user", "content": "Summarize the repo."}
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
FIELDS: dict[str, Any] = {"model": "reference", "instructions": "Use the tools.", "tools": TOOLS}


def tool_output(call: dict[str, Any], size: int = 800) -> dict[str, Any]:
    """The client's deterministic answer to a function call: `size` characters."""
    unit = f"[{call['call_id']}] def read(path): return open(path).read()\n"
    return {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": (unit * (size // len(unit) + 1))[:size],
    }


@dataclass
class Measured:
    """One turn: the response and the handler's work for it."""

    response: dict[str, Any]
    work: dict[str, int | float]


class Rig:
    """The reference app behind the middleware, and a client for both transports."""

    def __init__(self, client: TestClient, reference: Starlette) -> None:
        self.client = client
        self.stats = reference.state.reference_stats

    def post(self, context: list[dict[str, Any]], **fields: Any) -> Measured:
        self.stats.reset()
        reply = self.client.post("/v1/responses", json={**FIELDS, **fields, "input": context})
        assert reply.status_code == 200, reply.text
        return Measured(reply.json(), self.stats.snapshot())

    def send(self, socket: Socket, new: list[dict[str, Any]], **fields: Any) -> Measured:
        self.stats.reset()
        create = {"type": "response.create", **FIELDS, **fields, "input": new}
        socket.send_text(orjson.dumps(create).decode())
        while (event := orjson.loads(socket.receive_text()))["type"] != "response.completed":
            assert event["type"] not in FAILURE_EVENTS, event
        return Measured(event["response"], self.stats.snapshot())


Mode = Literal["always", "on_miss"]


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """`@pytest.mark.parametrize("rig", [(full_context, renderer)], indirect=True)`."""
    param: tuple[Mode, Renderer | None] = getattr(request, "param", ("on_miss", render_items))
    full_context, renderer = param
    reference = create_app(ReferenceConfig(tool_calls=TURNS - 1, answer_tokens=12))
    app = WebSocketModeMiddleware(reference, full_context=full_context, renderer=renderer)
    with TestClient(app) as client:
        yield Rig(client, reference)


def agent_loop_over_http(rig: Rig) -> list[Measured]:
    context: list[dict[str, Any]] = [USER]
    turns = []
    for _ in range(TURNS):
        measured = rig.post(context)
        turns.append(measured)
        (item,) = measured.response["output"]
        if item["type"] != "function_call":
            break
        context += [item, tool_output(item)]
    return turns


def agent_loop_over_socket(rig: Rig) -> list[Measured]:
    turns = []
    with rig.client.websocket_connect("/v1/responses") as socket:
        new, previous = [USER], None
        for _ in range(TURNS):
            measured = rig.send(socket, new, previous_response_id=previous)
            turns.append(measured)
            (item,) = measured.response["output"]
            if item["type"] != "function_call":
                break
            new, previous = [tool_output(item)], measured.response["id"]
    return turns


def assert_same_answers(over_socket: list[Measured], over_http: list[Measured]) -> None:
    assert len(over_socket) == len(over_http) == TURNS
    for via_socket, via_http in zip(over_socket, over_http, strict=True):
        assert via_socket.response["output"] == via_http.response["output"]
        assert via_socket.response["usage"] == via_http.response["usage"]
    answer = over_socket[-1].response["output"][0]["content"][0]["text"]
    assert f"answered after {TURNS - 1} tool calls." in answer


WITH_RENDERER = ("on_miss", render_items)
WITHOUT_RENDERER = ("on_miss", None)


@pytest.mark.parametrize("rig", [WITH_RENDERER], indirect=True)
def test_cache_aware_turns_do_flat_work(rig: Rig) -> None:
    over_http = agent_loop_over_http(rig)
    over_socket = agent_loop_over_socket(rig)
    assert_same_answers(over_socket, over_http)

    # HTTP: every turn renders and scans the whole, growing history.
    http_items = [turn.work["items_seen"] for turn in over_http]
    assert http_items == list(range(1, 2 * TURNS, 2))
    http_tokens = [turn.work["tokens_rendered"] for turn in over_http]
    assert http_tokens == sorted(http_tokens)
    assert http_tokens[-1] > 8 * http_tokens[1]
    assert all(turn.work["resumed"] == 0 for turn in over_http)

    # The socket: the first turn is a fresh chain; every later one resumes from its parent's
    # artifacts, looks at its one new item and renders nothing (the middleware rendered it).
    first, *later = over_socket
    assert (first.work["items_seen"], first.work["resumed"]) == (1, 0)
    assert [turn.work["items_seen"] for turn in later] == [1] * (TURNS - 1)
    assert [turn.work["tokens_rendered"] for turn in later] == [0] * (TURNS - 1)
    assert [turn.work["resumed"] for turn in later] == [1] * (TURNS - 1)
    # Each turn parses its own new items only.
    assert max(turn.work["bytes_parsed"] for turn in later) < 2_000
    assert over_http[-1].work["bytes_parsed"] > 8_000


@pytest.mark.parametrize("rig", [WITHOUT_RENDERER], indirect=True)
def test_without_a_renderer_the_server_renders_the_new_items_only(rig: Rig) -> None:
    over_http = agent_loop_over_http(rig)
    over_socket = agent_loop_over_socket(rig)
    assert_same_answers(over_socket, over_http)
    for index, turn in enumerate(over_socket[1:], start=1):
        parent = over_socket[index - 1].response
        sent = [tool_output(parent["output"][0])]
        # This turn's new item, then the output it produced (kept for the next turn).
        expected = len(render_items(sent)) + len(render_items(turn.response["output"]))
        assert turn.work["tokens_rendered"] == expected
        assert (turn.work["items_seen"], turn.work["resumed"]) == (1, 1)
    assert over_http[-1].work["tokens_rendered"] > 5 * over_socket[-1].work["tokens_rendered"]


@pytest.mark.parametrize("rig", [("always", render_items)], indirect=True)
def test_drop_in_mode_does_the_stateless_work(rig: Rig) -> None:
    over_http = agent_loop_over_http(rig)
    over_socket = agent_loop_over_socket(rig)
    assert_same_answers(over_socket, over_http)
    for via_socket, via_http in zip(over_socket, over_http, strict=True):
        for key in ("items_seen", "tokens_rendered"):
            assert via_socket.work[key] == via_http.work[key], key
        # The same history (the body differs by `stream: true` and its encoding).
        assert abs(via_socket.work["bytes_parsed"] - via_http.work["bytes_parsed"]) < 64
        assert via_socket.work["resumed"] == 0


@pytest.mark.parametrize("rig", [WITH_RENDERER, WITHOUT_RENDERER], indirect=True)
def test_warm_up_parents(rig: Rig) -> None:
    """A `generate: false` warm-up leaves no artifacts (the handler never ran): the next turn
    takes the items since the nearest response that left some, or the whole history."""
    with rig.client.websocket_connect("/v1/responses") as socket:
        warm = rig.send(socket, [USER], generate=False).response
        first = rig.send(socket, [], previous_response_id=warm["id"])
        # Nothing saved up the chain: the whole history, the stateless way.
        assert (first.work["items_seen"], first.work["resumed"]) == (1, 0)
        assert first.response["output"] == rig.post([USER]).response["output"]

        (call,) = first.response["output"]
        context = [USER, call, tool_output(call)]
        # A warm-up in the middle of the chain, then a turn that continues it.
        warm = rig.send(
            socket, [tool_output(call)], previous_response_id=first.response["id"], generate=False
        ).response
        assert warm["output"] == []
        second = rig.send(socket, [], previous_response_id=warm["id"])
        # Resumed from `first`'s artifacts over the warm-up's one item.
        assert (second.work["items_seen"], second.work["resumed"]) == (1, 1)
        over_http = rig.post(context)
        assert second.response["output"] == over_http.response["output"]
        assert second.response["usage"] == over_http.response["usage"]


@pytest.mark.parametrize("rig", [WITH_RENDERER, WITHOUT_RENDERER], indirect=True)
def test_forks_and_changed_settings_resume_exactly(rig: Rig) -> None:
    with rig.client.websocket_connect("/v1/responses") as socket:
        first = rig.send(socket, [USER]).response
        (call,) = first["output"]
        second = rig.send(socket, [tool_output(call)], previous_response_id=first["id"]).response
        # A fork from `first`, with other instructions and a user message: its own branch.
        fork_input = [tool_output(call, 10), {"role": "user", "content": "Only the README."}]
        fork = rig.send(
            socket, fork_input, previous_response_id=first["id"], instructions="Be brief."
        )
        assert fork.work["resumed"] == 1
        over_http = rig.post([USER, call, *fork_input], instructions="Be brief.")
        assert fork.response["output"] == over_http.response["output"]
        assert fork.response["usage"] == over_http.response["usage"]
        # Back on the main branch, with the tools removed.
        (next_call,) = second["output"]
        third = rig.send(
            socket, [tool_output(next_call)], previous_response_id=second["id"], tools=None
        )
        assert third.work["resumed"] == 1
        context = [USER, call, tool_output(call), next_call, tool_output(next_call)]
        over_http = rig.post(context, tools=None)
        assert third.response["output"] == over_http.response["output"]
        assert third.response["usage"] == over_http.response["usage"]


def test_the_answer_never_depends_on_the_renderer() -> None:
    """A middleware renderer only gives the token count: another tokenizer changes `usage`,
    never the output."""
    reference = create_app(ReferenceConfig(tool_calls=TURNS - 1, answer_tokens=12))
    foreign: Renderer = lambda items: [0] * len(items)  # noqa: E731
    app = WebSocketModeMiddleware(reference, full_context="on_miss", renderer=foreign)
    with TestClient(app) as client:
        rig = Rig(client, reference)
        over_http = agent_loop_over_http(rig)
        over_socket = agent_loop_over_socket(rig)
    for via_socket, via_http in zip(over_socket, over_http, strict=True):
        assert via_socket.response["output"] == via_http.response["output"]
    assert over_socket[-1].work["resumed"] == 1


def test_what_a_turn_leaves_for_the_next() -> None:
    seen: list[Saved | None] = []

    async def on_response(turn: Any, response: dict[str, Any]) -> None:
        # Plain JSON: a store that serializes artifacts keeps it.
        kept = orjson.loads(orjson.dumps(turn.artifacts[ARTIFACT_KEY]))
        seen.append(Saved.from_artifact(kept))

    reference = create_app(ReferenceConfig(tool_calls=1))
    app = WebSocketModeMiddleware(reference, full_context="on_miss", on_response=on_response)
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as socket:
        measured = Rig(client, reference).send(socket, [USER])
    (saved,) = seen
    assert saved is not None
    assert saved.tool_calls == 0
    assert saved.tokens == len(render_items([USER, *measured.response["output"]]))
    assert saved.instructions == FIELDS["instructions"]


GOOD: dict[str, Any] = {
    "format": 3,
    "digest_state": "00",
    "tool_calls": 0,
    "tokens": 1,
    "instructions": None,
    "instruction_tokens": 0,
    "open_calls": ["call_1"],
    "compacted": False,
    "declared": ["exec_command", "functions"],
}


@pytest.mark.parametrize(
    "kept",
    [
        None,
        "state",
        {**GOOD, "format": 0},
        {**GOOD, "digest_state": "zz"},
        {**GOOD, "tool_calls": -1},
        {**GOOD, "tokens": True},
        {**GOOD, "instructions": 3},
        {key: value for key, value in GOOD.items() if key != "instruction_tokens"},
        {**GOOD, "open_calls": [1]},
        {**GOOD, "compacted": "yes"},
        {**GOOD, "compacted": True, "tokens": None},
        {**GOOD, "declared": ["exec_command"]},
        {**GOOD, "declared": [1, None]},
    ],
)
def test_anything_unexpected_in_the_artifacts_reads_as_nothing_saved(kept: object) -> None:
    assert Saved.from_artifact(GOOD) is not None  # each case breaks one thing of a good one
    tokenizer = ReferenceTokenizer()
    parent = CachedResponse(
        id="resp_1", response={}, input_items=[USER], output_items=[], parent=None
    )
    parent.artifacts[ARTIFACT_KEY] = kept
    found = Turn(previous=parent, new_input=[USER], full_context=False)
    assert resume(found, None, tokenizer) is None

    # What `save` leaves reads back, and resumes to what the whole context gives.
    state = Saved(fold_items(b"", [USER]), 0, len(render_items([USER])), None, 0)
    parent.artifacts[ARTIFACT_KEY] = state.to_artifact()
    assert Saved.from_artifact(state.to_artifact()) == state
    resumed = resume(found, None, tokenizer)
    whole = stateless([USER, USER], None, tokenizer)
    assert resumed is not None
    assert (resumed.digest_state, resumed.tool_calls, resumed.tokens) == (
        whole.digest_state,
        whole.tool_calls,
        whole.tokens,
    )
