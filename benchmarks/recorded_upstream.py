"""The upstream of the peer comparison (``benchmarks/peer_litellm.py``), and its
check.

The upstream is the reference server (``ws_mode.toolkit.reference``, plain HTTP, no WebSocket mode,
zero model cost), or with ``--cheap`` the cheaper raw ASGI upstream of ``http_clients.py`` (it
does not even parse the body, so a front's cost is not lost in the upstream's), behind
:class:`Recorder`, which keeps the body of every ``POST /v1/responses``
and of its answer and hands them out at ``GET /record``. :func:`check_history` compares each
recorded request with the full history an HTTP client keeps (the previous input, the upstream's
output to it, what the client sent next) and with the client's other fields, so it tells
whether a proxy in front rebuilt the exact history. Two workloads: the agent tool loop of
``ws_mode.toolkit.rollout`` (:func:`tool_outputs`), and a three-message conversation whose every
answer is an assistant message (:func:`converse_http`, :func:`converse_socket`).

Run as ``python -m benchmarks.recorded_upstream --turns N [--cheap] --fd FD`` by
:func:`~ws_mode.testing._loopback.server_process`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ws_mode._sse import SSEDecoder
from ws_mode.testing._client import connect
from ws_mode.testing._diff import diff_fields, diff_items
from ws_mode.testing._loopback import add_child_arguments, serve_inherited
from ws_mode.toolkit.agent import DEFAULT_INSTRUCTIONS, DEFAULT_TOOLS, user_message
from ws_mode.toolkit.http_client import HttpClient
from ws_mode.toolkit.reference import ReferenceConfig, create_app
from ws_mode.toolkit.rollout import tool_output

from .http_clients import CheapUpstream

RECORD_PATH: Final = "/record"
API_PATH: Final = "/v1/responses"
MODEL: Final = "reference"


# ----------------------------------------------------------------------------- the upstream


class Recorder:
    """ASGI: keeps the body of every ``POST /v1/responses`` and of its answer; ``GET /record``
    hands them out as JSON (``?reset`` clears them afterwards)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls: list[tuple[bytearray, bytearray]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve `scope`, recording it when it is a create."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] == RECORD_PATH:
            await self._answer_records(scope, send)
        elif scope["method"] == "POST" and scope["path"] == API_PATH:
            request, answer = bytearray(), bytearray()
            self.calls.append((request, answer))

            async def recording_receive() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    request.extend(message.get("body", b""))
                return message

            async def recording_send(message: Message) -> None:
                if message["type"] == "http.response.body":
                    answer.extend(message.get("body", b""))
                await send(message)

            await self.app(scope, recording_receive, recording_send)
        else:
            await self.app(scope, receive, send)

    async def _answer_records(self, scope: Scope, send: Send) -> None:
        records = [
            {"request": orjson.loads(req), "output": _output(ans)} for req, ans in self.calls
        ]
        if b"reset" in scope.get("query_string", b""):
            self.calls.clear()
        body = orjson.dumps(records)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _output(answer: bytes | bytearray) -> list[Any] | None:
    """The output items of the response an answer (an SSE stream or JSON) carries."""
    if answer.lstrip().startswith(b"{"):
        output = orjson.loads(answer).get("output")
        return output if isinstance(output, list) else None
    for _, data in SSEDecoder().feed(bytes(answer) + b"\n\n"):
        with contextlib.suppress(orjson.JSONDecodeError):
            event = orjson.loads(data)
            if event.get("type") in ("response.completed", "response.incomplete"):
                output = event["response"].get("output")
                return output if isinstance(output, list) else None
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """The upstream child: the reference server (or the cheap one), plain HTTP, behind the
    recorder."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recorded_upstream")
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--cheap", action="store_true", help="the cheap upstream of http_clients")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    tool_calls = args.turns - 1
    upstream = (
        CheapUpstream(tool_calls)
        if args.cheap
        else create_app(ReferenceConfig(tool_calls=tool_calls))
    )
    serve_inherited(Recorder(upstream), args)


def fetch_records(upstream: str, *, reset: bool) -> list[dict[str, Any]]:
    """What the upstream received since the last reset (and reset it when asked)."""
    answer = httpx.get(upstream + RECORD_PATH + ("?reset" if reset else ""), timeout=60)
    answer.raise_for_status()
    records: list[dict[str, Any]] = answer.json()
    return records


# ----------------------------------------------------------------------------- the check


@dataclass
class Check:
    """How one run's upstream requests compare with what an HTTP client would send."""

    turns: int = 0
    exact: int = 0
    #: Turns whose input was exact, whatever the other fields.
    exact_input: int = 0
    differences: list[str] = field(default_factory=list)


#: What the client sends after the upstream's output of turn ``turn`` (from 1).
FollowUp = Callable[[int, list[Any]], list[Any]]


def check_history(
    records: list[dict[str, Any]], fields: dict[str, Any], first: list[Any], follow: FollowUp
) -> Check:
    """Compare each upstream request with the full history an HTTP client keeps: turn 1's
    input is `first`; each later one is the previous input, the upstream's output to it, and
    what the client sent next (`follow`). The other fields must be the client's `fields`."""
    check = Check(turns=len(records))
    expected = list(first)
    for turn, record in enumerate(records, 1):
        request: dict[str, Any] = record["request"]
        received = request.get("input")
        others = {key: value for key, value in request.items() if key != "input"}
        check.exact_input += received == expected
        if received == expected and others == fields:
            check.exact += 1
        elif not check.differences:
            if received != expected:
                check.differences.append(f"turn {turn} input: {diff_items(expected, received)}")
            if others != fields:
                check.differences.append(f"turn {turn} fields: {diff_fields(fields, others)}")
        output: list[Any] = record["output"] or []
        expected = [*expected, *output, *follow(turn, output)]
    return check


def tool_loop_fields() -> dict[str, Any]:
    """The fields the rollout sends with every turn (over HTTP, with ``stream``)."""
    tools = [dict(tool) for tool in DEFAULT_TOOLS]
    return {"model": MODEL, "instructions": DEFAULT_INSTRUCTIONS, "tools": tools, "stream": True}


def tool_outputs(tool_output_bytes: int) -> FollowUp:
    """The rollout's next items: an output for each call of the turn."""

    def follow(turn: int, output: list[Any]) -> list[Any]:
        return [
            {
                "type": "function_call_output",
                "call_id": item["call_id"],
                "output": tool_output(item["call_id"], tool_output_bytes),
            }
            for item in output
            if item.get("type") == "function_call"
        ]

    return follow


# ----------------------------------------------------------------------------- a conversation

#: A conversation's user messages; the model answers each with a message (no tool calls).
PROMPTS: Final = ("What does the agent loop do?", "And over a socket?", "Thanks, that is all.")
CONVERSATION_FIELDS: Final = {**tool_loop_fields(), "metadata": {"reference_tool_calls": "0"}}


def conversation_follow(turn: int, output: list[Any]) -> list[Any]:
    """The conversation's next user message."""
    return [user_message(PROMPTS[turn])] if turn < len(PROMPTS) else []


def converse_http(base_url: str, headers: dict[str, str]) -> None:
    """The conversation over HTTP, the whole history every turn."""
    history: list[Any] = []
    with HttpClient(timeout=120, headers=headers) as client:
        for prompt in PROMPTS:
            history.append(user_message(prompt))
            body = orjson.dumps({**CONVERSATION_FIELDS, "input": history})
            events = list(client.stream_events(base_url + API_PATH, body))
            history.extend(_terminal(events)["output"])


def converse_socket(base_url: str, headers: dict[str, str]) -> None:
    """The conversation over WebSocket mode: each turn continues the previous response."""
    fields = {key: value for key, value in CONVERSATION_FIELDS.items() if key != "stream"}
    previous: str | None = None
    with connect(base_url, API_PATH, headers=headers, open_timeout=120) as socket:
        for prompt in PROMPTS:
            event = {"type": "response.create", **fields, "input": [user_message(prompt)]}
            if previous is not None:
                event["previous_response_id"] = previous
            socket.send(event)
            previous = _terminal(socket.receive_turn(timeout=120))["id"]


def _terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The response of a turn's completed event; RuntimeError when it did not complete."""
    for event in events:
        if event.get("type") == "response.completed":
            response: dict[str, Any] = event["response"]
            return response
    raise RuntimeError(f"the turn did not complete: {events[-1] if events else 'no events'}")


if __name__ == "__main__":
    main(sys.argv[1:])
