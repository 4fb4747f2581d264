"""The ten HTTP cases of the Open Responses compliance suite, as our own tests, against the
reference server as ``ws-mode serve`` runs it and behind ``ws-mode proxy``.

Every answer is checked against the schema (:mod:`tests.compliance.schema`) before the case's
own checks; the case ids are the suite's.
"""

from __future__ import annotations

import copy

import pytest

from tests.compliance.helpers import (
    MODEL,
    WEATHER_TOOL,
    compact,
    completed,
    create,
    message,
    post,
    stream,
)
from tests.compliance.schema import check_response

#: A 2x2 red PNG, as a data URL.
RED_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQ"
    "CgAf7gP9i18U1AAAAABJRU5ErkJggg=="
)


@pytest.fixture(params=["serve", "proxy"])
def http_base(request: pytest.FixtureRequest, bases: dict[str, str]) -> str:
    url: str = bases[request.param]
    return url


def test_basic_response(http_base: str) -> None:
    response = create(http_base, {"input": [message("user", "Greet me in three words.")]})
    completed(response)


def test_assistant_phase(http_base: str) -> None:
    """Assistant history labelled with phases is accepted."""
    history = [
        message("assistant", "Let me look at the saved value.", phase="commentary"),
        message("assistant", "The saved value is seven.", phase="final_answer"),
        message("user", "Say only the value."),
    ]
    completed(create(http_base, {"input": history}))


def test_response_output_phase_schema(http_base: str) -> None:
    """The schema takes assistant output messages with phase labels (the suite checks a fixed
    response; here a real one, its output replaced by two phased messages)."""
    response = create(http_base, {"input": "Hello", "metadata": {"reference_tool_calls": "0"}})
    answer = response["output"][0]
    phased = copy.deepcopy(response)
    phased["output"] = [
        {**answer, "id": "msg_commentary", "phase": "commentary"},
        {**answer, "id": "msg_final", "phase": "final_answer"},
    ]
    assert check_response(phased) == []
    assert [item["phase"] for item in phased["output"]] == ["commentary", "final_answer"]
    phased["output"][0]["phase"] = 3
    assert check_response(phased) != []  # the check does look at the phase


def test_streaming_response(http_base: str) -> None:
    events = stream(http_base, {"input": [message("user", "Count to five.")]})
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["completed_at"] is None
    assert events[-1]["type"] == "response.completed"
    completed(events[-1]["response"])
    assert [event["sequence_number"] for event in events] == list(range(len(events)))


def test_system_prompt(http_base: str) -> None:
    history = [message("system", "Answer like a sailor."), message("user", "Say hello.")]
    completed(create(http_base, {"input": history}))


def test_tool_calling(http_base: str) -> None:
    body = {"input": [message("user", "How warm is it in Oslo?")], "tools": [WEATHER_TOOL]}
    response = create(http_base, body)
    assert response["output"]
    assert any(item["type"] == "function_call" for item in response["output"])
    (echoed,) = response["tools"]
    assert echoed["name"] == "get_weather"
    assert echoed["strict"] is True


def test_image_input(http_base: str) -> None:
    content = [
        {"type": "input_text", "text": "Describe this picture in one sentence."},
        {"type": "input_image", "image_url": RED_PNG},
    ]
    completed(create(http_base, {"input": [message("user", content)]}))


def test_multi_turn(http_base: str) -> None:
    history = [
        message("user", "I am called Ada."),
        message("assistant", "Nice to meet you, Ada."),
        message("user", "What am I called?"),
    ]
    completed(create(http_base, {"input": history}))


def test_compact_response(http_base: str) -> None:
    body = {
        "model": MODEL,
        "prompt_cache_key": "compliance-compact",
        "input": [
            message("user", "We ship on Friday and tell the support team first."),
            message("assistant", "Noted: Friday, support told beforehand."),
        ],
    }
    compacted = compact(http_base, body)
    assert compacted["output"]
    assert compacted["object"] == "response.compaction"
    assert any(item["type"] == "compaction" for item in compacted["output"])


def test_compact_missing_model(http_base: str) -> None:
    answer = post(http_base, "/responses/compact", {"input": [message("user", "Compact me.")]})
    assert answer.status_code in (400, 422)
    assert answer.json()["error"]["param"] == "model"
