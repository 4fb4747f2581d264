"""The WebSocket cases of the Open Responses compliance suite (seven, and the eighth of a newer
version: a ``generate: false`` warm-up), as our own tests, over a real socket: against
``ws-mode serve`` (whole history every turn, and ``on_miss``) and against ``ws-mode proxy`` in
front of the plain-HTTP reference server.

A turn ends at its terminal event (a response event or an error event); every event of a turn
that must succeed is checked against the schema, the WebSocket error envelope included.
"""

from __future__ import annotations

from typing import Any

from tests.compliance.helpers import (
    MODEL,
    WEATHER_TOOL,
    Turn,
    compact,
    completed,
    message,
    missing_id,
    session,
)


def _continue(text: str, **extra: Any) -> Any:
    """A step continuing the first turn's response with ``text``."""

    def step(turns: list[Turn]) -> dict[str, Any]:
        first = turns[0].response
        assert first is not None, "the first turn did not return a response"
        return {"store": False, "previous_response_id": first["id"], "input": text, **extra}

    return step


def test_websocket_response(base: str) -> None:
    (turn,) = session(base, [{"input": [message("user", "Count to three.")]}])
    completed(turn.valid())
    assert turn.events[0]["type"] == "response.created"


def test_websocket_sequential_responses(base: str) -> None:
    turns = session(
        base,
        [
            {"store": False, "input": "Answer with the word: one"},
            {"store": False, "input": "Answer with the word: two"},
        ],
    )
    responses = [turn.valid() for turn in turns]
    for response in responses:
        completed(response)
    assert responses[0]["id"] != responses[1]["id"]
    assert responses[1]["previous_response_id"] is None


def test_websocket_continuation(base: str) -> None:
    first, second = session(
        base,
        [
            {"store": False, "input": "The password is amber. Answer OK."},
            _continue("What is the password? Answer with it alone."),
        ],
    )
    first_response = first.valid()
    response = second.valid()
    completed(response)
    assert response["previous_response_id"] == first_response["id"]


def test_websocket_reconnect_store_false_recovery(base: str) -> None:
    (first,) = session(base, [{"store": False, "input": "The password is brass. Answer OK."}])
    previous = first.valid()["id"]
    recovery_input = [message("user", "The old chain is gone; start again and answer: back")]
    lost, recovered = session(
        base,
        [
            {"store": False, "previous_response_id": previous, "input": "Go on. Answer: again"},
            {"store": False, "input": recovery_input},
        ],
    )
    assert lost.error_code == "previous_response_not_found"
    assert "previous_response_id" not in recovered.request
    completed(recovered.valid())


def test_websocket_previous_response_not_found(base: str) -> None:
    (turn,) = session(
        base,
        [{"store": False, "previous_response_id": missing_id(), "input": "This cannot go on."}],
    )
    assert turn.error_code == "previous_response_not_found"
    assert turn.terminal["type"] == "error"
    assert turn.terminal["status"] == 400


def test_websocket_failed_continuation_evicts_cache(base: str) -> None:
    unanswerable = {
        "type": "function_call_output",
        "call_id": "call_nobody_made",
        "output": "There is no call this answers.",
    }
    first, failed, retry = session(
        base,
        [
            {"store": False, "input": "The password is coal. Answer OK."},
            _continue("", input=[unanswerable]),
            _continue("Try again after the failure. Answer: stale"),
        ],
    )
    first.valid()
    assert failed.failed
    assert failed.terminal["type"] == "error"
    assert failed.terminal["status"] == 400
    assert failed.terminal["error"]["param"] == "input"
    assert "call_nobody_made" in failed.terminal["error"]["message"]
    assert retry.error_code == "previous_response_not_found"


def test_websocket_compact_new_chain(base: str) -> None:
    history = [
        message("user", [{"type": "input_text", "text": "Keep the code word in mind: quartz."}]),
        message("assistant", [{"type": "output_text", "text": "Kept."}]),
        message("user", [{"type": "input_text", "text": "Compact this conversation."}]),
    ]
    compacted = compact(base, {"model": MODEL, "input": history})
    follow_up = message("user", "Go on from here. Answer: compacted")
    (turn,) = session(
        base, [{"store": False, "input": [*compacted["output"], follow_up], "tools": []}]
    )
    assert "previous_response_id" not in turn.request
    response = turn.valid()
    completed(response)
    # The new chain reads the compacted context as the whole one: the same answer.
    (full,) = session(base, [{"store": False, "input": [*history, follow_up], "tools": []}])
    assert response["output"] == full.valid()["output"]


def test_websocket_warmup_generate_false(base: str) -> None:
    warm, answered = session(
        base,
        [
            {"store": False, "generate": False, "input": "The password is slate.",
             "tools": [WEATHER_TOOL]},
            _continue("What is the password? Answer with it alone."),
        ],
    )  # fmt: skip
    # A warm-up: a response created and completed at once, with no output, that a
    # continuation builds on.
    warmed = warm.valid()
    assert [event["type"] for event in warm.events] == ["response.created", "response.completed"]
    assert warmed["status"] == "completed"
    assert warmed["output"] == []
    response = answered.valid()
    completed(response)
    assert response["previous_response_id"] == warmed["id"]


def test_a_socket_create_may_carry_stream_as_codex_sends_it(base: str) -> None:
    # One version of the suite's schema refuses `stream` in a socket's response.create; Codex
    # always sends it, so a server takes it (and the socket streams either way).
    turns = session(
        base,
        [{"store": False, "stream": True, "input": "Count to three."},
         {"store": False, "stream": False, "input": "Count to two."}],
        http_only=True,
    )  # fmt: skip
    for turn in turns:
        completed(turn.valid())
        assert turn.events[0]["type"] == "response.created"
