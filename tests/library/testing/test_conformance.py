"""The conformance suite of the kit: its cases pass against the reference server behind the
middleware, each fails (saying what it saw) against a stack broken in the way its rule forbids,
skips what a server may legitimately not do, and runs under pytest one case at a time.

One server for the module: the reference behind `WebSocketModeMiddleware`, wrapped by a
`FrameEdit` whose edit each test switches (none: the correct stack)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.library.testing.apps import FrameEdit
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._handler_call import replay_body
from ws_mode._limits import Limits
from ws_mode.testing import (
    CONFORMANCE_CASES,
    ConformanceFailure,
    ConformanceOptions,
    check_conformance_case,
    conformance_summary,
    run_conformance,
)
from ws_mode.testing._conformance import select_cases
from ws_mode.toolkit.reference import ReferenceConfig, create_app

Edit = Callable[[dict[str, Any]], list[Any]]
#: The model the rate-limited layer answers with 429.
LIMITED = "rate-limited-model"
RATE_LIMIT_HEADERS = [(b"retry-after", b"2"), (b"x-ratelimit-remaining-requests", b"0")]


class RateLimited:
    """Answers a request for the model `LIMITED` with 429 and rate-limit headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"")
        if json.loads(body or b"{}").get("model") != LIMITED:
            await self.app(scope, replay_body(body, receive), send)
            return
        error = {"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded",
                           "message": "Slow down.", "param": None}}  # fmt: skip
        headers = [(b"content-type", b"application/json"), *RATE_LIMIT_HEADERS]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(error).encode()})


class Switch:
    """The edit the served stack applies to each event frame (None: none)."""

    edit: Edit | None = None

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        return [event] if self.edit is None else self.edit(event)


SWITCH = Switch()


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    reference = create_app(ReferenceConfig(tool_calls=1, tokens_per_second=400))
    with serve(FrameEdit(WebSocketModeMiddleware(RateLimited(reference)), SWITCH)) as url:
        yield url


@pytest.fixture
def broken() -> Iterator[Switch]:
    """The served stack's switch, reset after the test."""
    yield SWITCH
    SWITCH.edit = None


def outcome(base: str, name: str, **options: Any) -> tuple[str, str]:
    (result,) = run_conformance(base, ConformanceOptions(timeout=10, **options), cases=[name])
    return result.outcome, result.detail


def test_cases_have_stable_unique_names_a_rule_and_a_source() -> None:
    names = [case.name for case in CONFORMANCE_CASES]
    assert len(names) == len(set(names)) >= 35
    for case in CONFORMANCE_CASES:
        assert re.fullmatch(r"[a-z]+\.[a-z_]+", case.name), case.name
        assert str(case) == case.name
        assert case.rule
        assert "OpenAI" in case.source or "docs/protocol.md" in case.source, case.source
    families = {name.partition(".")[0] for name in names}
    assert families == {
        "lanes",
        "limits",
        "state",
        "warmup",
        "steering",
        "interrupt",
        "errors",
        "frames",
        "codex",
    }


def test_cases_are_selected_by_shell_patterns() -> None:
    assert [case.name for case in select_cases(CONFORMANCE_CASES, ["lanes.f*"])] == [
        "lanes.fifo",
        "lanes.fork",
    ]
    assert len(select_cases(CONFORMANCE_CASES, [])) == len(CONFORMANCE_CASES)
    assert select_cases(CONFORMANCE_CASES, ["nothing.*"]) == []


def test_the_reference_behind_the_middleware_passes_the_cases_it_is_broken_for_below(
    base: str,
) -> None:
    # Every case is run against ws-mode serve and ws-mode proxy in
    # tests/toolkit/cli/test_check_conformance.py; here, those the edits below break.
    patterns = ["errors.envelope", "lanes.default_lane_unmarked", "lanes.stream_id_echoed",
                "lanes.concurrent", "steering.*", "interrupt.*", "codex.*",
                "*rate_limit*"]  # fmt: skip
    results = run_conformance(base, ConformanceOptions(timeout=10), cases=patterns)
    outcomes = {result.name: result.outcome for result in results}
    assert outcomes.pop("errors.rate_limit_headers") == "skipped"
    assert set(outcomes.values()) == {"passed"}, results
    assert conformance_summary(results) == f"{len(results) - 1} passed, 0 failed, 1 skipped"


def _without_sequence_number(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "error":
        event.pop("sequence_number", None)
    return [event]


def _lane_on_default(event: dict[str, Any]) -> list[Any]:
    return [{**event, "stream_id": event.get("stream_id", "main")}]


def _terminal_without_lane(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        event.pop("stream_id", None)
    return [event]


def _short_steer_id(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.steer.accepted":
        event["steer"]["id"] = event["steer"]["id"][:30]
    return [event]


def _open_item_dropped(event: dict[str, Any]) -> list[Any]:
    return [] if event["type"] == "response.output_item.interrupted" else [event]


def _steer_failure_as_server_error(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.steer.failed":
        event["error"]["type"] = "server_error"
    return [event]


def _pending_without_steer(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.steer.pending":
        del event["steer"]
    return [event]


def _error_answers_processed(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.created" and not event["response"].get("output"):
        # The warm-up after `response.processed`: an error comes first, as if it answered it.
        error = {"type": "error", "status": 400, "sequence_number": 0,
                 "error": {"type": "invalid_request_error", "code": "unknown_event_type",
                           "message": "Unknown event.", "param": "type"}}  # fmt: skip
        return [error, event]
    return [event]


class OneLaneAtATime:
    """Holds the events of the lanes named `quick` until the `slow` lane's response ends, as a
    server that runs lanes one after the other sends them."""

    def __init__(self) -> None:
        self.held: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        lane = str(event.get("stream_id"))
        if "quick" in lane:
            self.held.append(event)
            return []
        if "slow" in lane and event["type"] == "response.completed":
            held, self.held = self.held, []
            return [event, *held]
        return [event]


@pytest.mark.parametrize(
    ("name", "edit", "seen"),
    [
        ("errors.envelope", _without_sequence_number, "no integer 'sequence_number'"),
        ("lanes.default_lane_unmarked", _lane_on_default, "carries a stream_id on the default"),
        ("lanes.stream_id_echoed", _terminal_without_lane, "does not carry its lane's stream_id"),
        ("steering.accepted", _short_steer_id, "is not steer_ and 32 hex digits"),
        (
            "steering.response_not_found",
            _steer_failure_as_server_error,
            "error.type 'server_error', not 'invalid_request_error'",
        ),
        ("steering.pending", _pending_without_steer, "response.steer.pending is not what the SDKs"),
        ("codex.response_processed", _error_answers_processed, "unknown_event_type"),
        ("interrupt.accepted", _open_item_dropped, "got neither response.output_item.interrupted"),
        ("lanes.concurrent", OneLaneAtATime(), "the lanes ran one after the other"),
    ],
)
def test_a_stack_that_breaks_a_rule_fails_its_case_saying_what_it_saw(
    base: str, broken: Switch, name: str, edit: Edit, seen: str
) -> None:
    broken.edit = edit
    result, detail = outcome(base, name)
    assert result == "failed"
    assert seen in detail


def test_a_server_that_does_not_steer_skips_the_steering_cases(base: str, broken: Switch) -> None:
    def not_supported(event: dict[str, Any]) -> list[Any]:
        if event["type"].startswith("response.steer."):
            error = {"type": "invalid_request_error", "code": "steering_not_supported",
                     "message": "No steering here."}  # fmt: skip
            return [{"type": "response.steer.failed", "sequence_number": 0, "error": error}]
        return [event]

    broken.edit = not_supported
    results = run_conformance(base, ConformanceOptions(timeout=10), cases=["steering.*"])
    assert len(results) == 8
    for result in results:
        assert result.outcome == "skipped", (result.name, result.detail)
        assert "steering_not_supported" in result.detail


def test_rate_limit_headers_pass_in_error_headers_and_fail_without(
    base: str, broken: Switch
) -> None:
    limited = {"rate_limited_request": {"model": LIMITED}}

    def with_headers(event: dict[str, Any]) -> list[Any]:
        if event["type"] == "error" and event.get("status") == 429:
            event["error"]["headers"] = {name.decode(): value.decode()
                                         for name, value in RATE_LIMIT_HEADERS}  # fmt: skip
        return [event]

    broken.edit = with_headers
    result, detail = outcome(base, "errors.rate_limit_headers", **limited)
    assert (result, detail) == (
        "passed",
        "429 with error.headers retry-after, x-ratelimit-remaining-requests",
    )
    broken.edit = lambda event: [
        {**event, "error": {k: v for k, v in event["error"].items() if k != "headers"}}
        if event["type"] == "error"
        else event
    ]
    result, detail = outcome(base, "errors.rate_limit_headers", **limited)
    assert (result, detail) == ("failed", "the 429 error has no error.headers object")


def test_the_lifetime_error_is_waited_for_when_the_run_knows_the_lifetime() -> None:
    app = WebSocketModeMiddleware(create_app(), limits=Limits(max_connection_seconds=0.3))
    with serve(app) as url:
        (result,) = run_conformance(
            url, ConformanceOptions(timeout=10, connection_lifetime=0.3), cases=["*lifetime"]
        )
    assert result.outcome == "passed", result.detail
    assert "websocket_connection_limit_reached after" in result.detail


def test_check_conformance_case_passes_fails_and_skips_as_pytest_expects(
    base: str, broken: Switch
) -> None:
    assert check_conformance_case("state.chained", base).outcome == "passed"
    with pytest.raises(pytest.skip.Exception, match=r"errors\.rate_limit_headers: "):
        check_conformance_case("errors.rate_limit_headers", base)
    broken.edit = _without_sequence_number
    envelope = next(case for case in CONFORMANCE_CASES if case.name == "errors.envelope")
    with pytest.raises(ConformanceFailure) as caught:
        check_conformance_case(envelope, base)
    assert caught.value.result.name == "errors.envelope"
    assert "rule: an error event is" in str(caught.value)
    with pytest.raises(KeyError, match="no conformance case"):
        check_conformance_case("lanes.nothing", base)


@pytest.mark.parametrize("case", select_cases(CONFORMANCE_CASES, ["warmup.*"]), ids=str)
def test_the_documented_parametrization_names_each_test_after_its_case(
    base: str, case: Any, request: pytest.FixtureRequest
) -> None:
    assert request.node.callspec.id == case.name
    check_conformance_case(case, base, ConformanceOptions(timeout=10))
