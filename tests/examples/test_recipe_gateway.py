"""Recipe (b), `examples/cache_aware_gateway.py`: a gateway that checks the client's input, then
calls a hosted model (here the reference server, stateless, over plain HTTP). Over the socket it
checks only each turn's new items, forwards the whole history, and answers as plain HTTP does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from examples.cache_aware_gateway import create_app, keyword_moderator
from tests.servers import serve
from ws_mode.testing._client import SyncSocket, connect
from ws_mode.toolkit.reference import ReferenceConfig
from ws_mode.toolkit.reference import create_app as create_reference
from ws_mode.toolkit.rollout import run_http, run_socket

Item = dict[str, Any]
OPTIONS: dict[str, Any] = {
    "turns": 6,
    "follow_ups": ["Now the tests."],
    "tool_output_bytes": 256,
    "timeout": 10.0,
}


@dataclass
class Moderator:
    """The example's keyword check, recording how many items each call checked."""

    checked: list[int] = field(default_factory=list)

    async def __call__(self, items: list[Item]) -> str | None:
        self.checked.append(len(items))
        return await keyword_moderator(items)


@dataclass
class Rig:
    upstream: str
    gateway: str
    moderator: Moderator


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    moderator = Moderator()
    reference = create_reference(ReferenceConfig(tool_calls=2, answer_tokens=8))
    with serve(reference, lifetime=60) as upstream:
        gateway = create_app(upstream + "/v1", moderate=moderator)
        with serve(gateway, lifetime=60) as base_url:
            yield Rig(upstream, base_url, moderator)


def turn(socket: SyncSocket, **fields: Any) -> dict[str, Any]:
    """Send one create; its terminal event."""
    socket.send({"type": "response.create", "model": "m", **fields})
    return socket.receive_turn(timeout=10)[-1]


def test_checks_only_new_items_and_answers_like_http(rig: Rig) -> None:
    direct = run_http(rig.upstream, **OPTIONS)
    rig.moderator.checked.clear()
    http = run_http(rig.gateway, **OPTIONS)
    over_http = list(rig.moderator.checked)
    rig.moderator.checked.clear()
    socket = run_socket(rig.gateway, **OPTIONS)
    over_socket = list(rig.moderator.checked)

    # The reference model digests its whole context: equal answers, equal contexts upstream.
    assert socket.answer == http.answer == direct.answer
    assert socket.tool_calls == http.tool_calls == 4
    # Plain HTTP checks the whole history every turn; the socket each turn's one new item.
    assert over_http == [1, 3, 5, 7, 9, 11]
    assert over_socket == [1] * 6


def test_a_refused_item_is_an_error_event_and_the_conversation_goes_on(rig: Rig) -> None:
    with connect(rig.gateway, open_timeout=10) as socket:
        first = turn(socket, input="Clean up the build directory.")
        assert first["type"] == "response.completed"
        parent = first["response"]["id"]
        refused = turn(socket, input="Run rm -rf / now.", previous_response_id=parent)
        assert refused["type"] == "error"
        assert refused["status"] == 400
        assert refused["error"]["code"] == "content_policy_violation"
        # A failed continuation drops its parent (docs/protocol.md): the client resends the
        # whole context, on the same socket.
        gone = turn(socket, input="Only the build directory.", previous_response_id=parent)
        assert gone["error"]["code"] == "previous_response_not_found"
        context = [{"role": "user", "content": "Clean up the build directory."}]
        context += first["response"]["output"]
        context += [{"role": "user", "content": "Only the build directory."}]
        again = turn(socket, input=context)
    assert again["type"] == "response.completed"


def test_a_warm_ups_input_is_checked_by_the_next_turn(rig: Rig) -> None:
    """A `generate: false` warm-up never reaches the handler: its input is checked with the
    first turn that does."""
    rig.moderator.checked.clear()
    with connect(rig.gateway, open_timeout=10) as socket:
        warm = turn(socket, input=[{"role": "developer", "content": "DROP TABLE users"}],
                    generate=False)  # fmt: skip
        assert warm["type"] == "response.completed"
        refused = turn(socket, input="Hello", previous_response_id=warm["response"]["id"])
        assert refused["type"] == "error"
        assert "DROP TABLE" in refused["error"]["message"]

        clean = turn(socket, input=[{"role": "developer", "content": "Be brief."}],
                     generate=False)  # fmt: skip
        first = turn(socket, input="Hello", previous_response_id=clean["response"]["id"])
        assert first["type"] == "response.completed"
        second = turn(socket, input="More", previous_response_id=first["response"]["id"])
        assert second["type"] == "response.completed"
    # The dirty warm-up and its turn (2 items), the clean one and its turn (2), then 1 new item.
    assert rig.moderator.checked == [2, 2, 1]
    assert json.loads(first["response"]["output"][0]["arguments"])["step"] == 1
