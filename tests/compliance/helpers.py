"""What the compliance cases share: the HTTP calls and socket sessions they make, and the
checks every answer gets (the schema of :mod:`tests.compliance.schema`, then the case's own)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from tests.compliance.schema import check_compacted, check_response, check_stream
from ws_mode.testing._client import connect
from ws_mode.toolkit.http_client import HttpClient

MODEL = "reference-model"
TIMEOUT = 10.0
#: Fields a socket `response.create` must not carry (HTTP streaming and background modes).
HTTP_ONLY = frozenset({"stream", "stream_options", "background"})
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "A city name, e.g. Oslo"}},
        "required": ["city"],
    },
}


def message(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    """A typed input message."""
    return {"type": "message", "role": role, "content": content, **extra}


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """``POST {base}/v1{path}`` with a JSON body; the raw answer."""
    with HttpClient(base, timeout=TIMEOUT) as client:
        answer: httpx.Response = client.client.post(f"/v1{path}", json=body)
        answer.read()
        return answer


def create(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed ``POST /v1/responses`` that must answer 200 with a valid response."""
    answer = post(base, "/responses", {"model": MODEL, **body})
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()
    problems = check_response(response)
    assert not problems, problems
    return response


def stream(base: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``stream: true`` ``POST /v1/responses``: its events, each checked, terminal last."""
    with HttpClient(base, timeout=TIMEOUT) as client:
        events = list(
            client.stream_events(
                "/v1/responses", orjson.dumps({"model": MODEL, **body, "stream": True})
            )
        )
    problems = check_stream(events)
    assert not problems, problems
    return events


def compact(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """A ``POST /v1/responses/compact`` that must answer 200 with a valid compacted object."""
    answer = post(base, "/responses/compact", body)
    assert answer.status_code == 200, answer.text
    compacted: dict[str, Any] = answer.json()
    problems = check_compacted(compacted)
    assert not problems, problems
    return compacted


def completed(response: dict[str, Any]) -> None:
    """The suite's semantic checks of most cases: some output, status completed."""
    assert response["output"], "the response has no output items"
    assert response["status"] == "completed", response["status"]


@dataclass
class Turn:
    """One ``response.create`` of a socket session and every event it got."""

    request: dict[str, Any]
    events: list[dict[str, Any]]

    @property
    def terminal(self) -> dict[str, Any]:
        return self.events[-1]

    @property
    def response(self) -> dict[str, Any] | None:
        """The terminal event's response, when the turn ended with a response event."""
        response: dict[str, Any] | None = self.terminal.get("response")
        return response

    @property
    def error_code(self) -> str | None:
        """The code of the error event (or failed response) that ended the turn."""
        error = self.terminal.get("error") or (self.response or {}).get("error") or {}
        code: str | None = error.get("code")
        return code

    @property
    def failed(self) -> bool:
        """Whether the turn ended with an error event, an error, or a failed response."""
        return (
            self.terminal["type"] == "error"
            or self.error_code is not None
            or (self.response or {}).get("status") == "failed"
        )

    def valid(self) -> dict[str, Any]:
        """The response of a turn that must have succeeded, its events checked."""
        problems = check_stream(self.events, websocket=True)
        assert not problems, problems
        assert self.response is not None
        return self.response


Step = dict[str, Any] | Callable[[list[Turn]], dict[str, Any]]


def session(base: str, steps: list[Step], *, http_only: bool = False) -> list[Turn]:
    """One socket; each step's ``response.create`` (a body, or made from the turns before it)
    sent once the previous turn ended. The suite's creates carry no HTTP-only field; with
    ``http_only`` they may (Codex sends ``stream`` on the socket)."""
    turns: list[Turn] = []
    with connect(base, open_timeout=TIMEOUT) as socket:
        for step in steps:
            body = step(turns) if callable(step) else step
            body = {"type": "response.create", "model": MODEL, **body}
            if not http_only:
                assert not HTTP_ONLY & set(body), "a socket create carries no HTTP-only field"
            socket.send(body)
            turns.append(Turn(body, socket.receive_turn(timeout=TIMEOUT)))
    return turns


def missing_id() -> str:
    """A response id no server has seen."""
    return f"resp_missing_{uuid.uuid4().hex}"
