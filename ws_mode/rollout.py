"""An agent rollout against a Responses server, over plain HTTP or over WebSocket mode.

The agent is the loop every coding agent runs: send the context, let the model ask for a tool,
run the tool, send its output, repeat until the model answers with a message. One rollout is
that loop for up to ``turns`` model calls. Against the reference server
(``ws_mode.reference``, started with ``tool_calls=turns - 1``) the model asks for a tool on
every turn but the last.

Two drivers run the same rollout:

- :func:`run_http` posts ``stream: true`` requests to ``POST /v1/responses`` over one keep-alive
  connection, each carrying the whole history (the client keeps it: the previous context, the
  previous output, the new tool outputs), and reads the SSE stream to its terminal event;
- :func:`run_socket` opens one WebSocket at ``ws://…/v1/responses``, sends the user message
  first, then on every later turn only ``previous_response_id`` and the new tool outputs.

Both return a :class:`RolloutResult` with per-turn wall times and the bytes the client sent,
and raise :class:`RolloutError` when the server answers an error. The drivers are synchronous
(``httpx.Client`` and ``websockets.sync``); run them in threads for concurrent rollouts.

Needs the ``cli`` extra (``pip install "ws-mode[cli]"``) for httpx and websockets.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import httpx
import orjson
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import connect
from websockets.sync.connection import Connection

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_PROMPT",
    "DEFAULT_TOOLS",
    "RolloutError",
    "RolloutResult",
    "TurnCallback",
    "run_http",
    "run_socket",
    "tool_output",
]

DEFAULT_PROMPT: Final = "Find where the configuration is loaded, then explain how it is validated."
"""The user message that starts every rollout unless the caller gives another."""

DEFAULT_INSTRUCTIONS: Final = "You are a coding agent. Read the files you need, then answer."
"""The instructions sent on every turn unless the caller gives others."""

DEFAULT_TOOLS: Final[tuple[dict[str, Any], ...]] = (
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
)
"""The tools sent on every turn unless the caller gives others."""

DEFAULT_PATH: Final = "/v1/responses"
TERMINAL_EVENTS: Final = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "error"}
)
_FILLER: Final = " lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"

TurnCallback = Callable[[int, float], None]
"""Called after each turn with the turn's number (from 1) and its wall time in seconds."""


class RolloutError(Exception):
    """The rollout could not go on: the server answered an error, or could not be reached."""


@dataclass
class RolloutResult:
    """The measurements of one rollout.

    Attributes:
        mode: ``"http"`` or ``"socket"``.
        turn_seconds: each turn's wall time, from sending the request to its terminal event.
        turn_bytes: the bytes the client sent each turn (request body, or frame text).
        total_seconds: the whole rollout's wall time, from before connecting to the answer:
            connection setup (the socket's handshake; HTTP connects during turn 1) and the
            client's own work between turns included, closing the connection not.
        answer: the text of the model's final message.
        tool_calls: the tool calls the model asked for (and the client answered).
        response_ids: the id of each turn's response.
    """

    mode: Literal["http", "socket"]
    turn_seconds: list[float] = field(default_factory=list)
    turn_bytes: list[int] = field(default_factory=list)
    total_seconds: float = 0.0
    answer: str = ""
    tool_calls: int = 0
    response_ids: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        """The number of model calls made."""
        return len(self.turn_seconds)

    @property
    def bytes_sent(self) -> int:
        """The bytes the client sent over the whole rollout."""
        return sum(self.turn_bytes)

    def early_median(self, count: int = 3) -> float:
        """The median wall time of the first ``count`` turns, in seconds."""
        return _median(self.turn_seconds[:count])

    def late_median(self, count: int = 3) -> float:
        """The median wall time of the last ``count`` turns, in seconds."""
        return _median(self.turn_seconds[-count:] if count > 0 else [])


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def tool_output(call_id: str, size: int) -> str:
    """The deterministic output of the tool call ``call_id``: ``size`` ASCII characters (and as
    many bytes, JSON-encoded too: no character needs escaping)."""
    if size <= 0:
        return ""
    unit = f"[{call_id}]{_FILLER}"
    return (unit * (size // len(unit) + 1))[:size]


def _user_message(prompt: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": prompt}],
    }


def _check_arguments(turns: int, tool_output_bytes: int) -> None:
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"turns must be an int >= 1, got {turns!r}")
    if isinstance(tool_output_bytes, bool) or not isinstance(tool_output_bytes, int):
        raise ValueError(f"tool_output_bytes must be an int, got {tool_output_bytes!r}")
    if tool_output_bytes < 0:
        raise ValueError(f"tool_output_bytes must be >= 0, got {tool_output_bytes}")


def _request_fields(
    model: str,
    tools: Sequence[Mapping[str, Any]] | None,
    instructions: str | None,
    metadata: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The fields every turn sends. Instructions are not carried over from the previous
    response (PROTOCOL.md §4), and clients re-send their tools, so both go on every turn."""
    fields: dict[str, Any] = {"model": model}
    if instructions is not None:
        fields["instructions"] = instructions
    if tools is not None:
        fields["tools"] = [dict(tool) for tool in tools]
    if metadata:
        fields["metadata"] = dict(metadata)
    return fields


class _Agent:
    """The client side of the loop: reads each turn's output, runs the tools it asks for."""

    def __init__(self, result: RolloutResult, turns: int, tool_output_bytes: int) -> None:
        self.result = result
        self.turns = turns
        self.tool_output_bytes = tool_output_bytes

    def step(self, response: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Record a finished turn; return the tool outputs to send next, or None when the
        model answered."""
        result = self.result
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id:
            raise RolloutError(f"turn {result.turns}: the response has no id")
        result.response_ids.append(response_id)
        output = response.get("output")
        if not isinstance(output, list):
            raise RolloutError(f"turn {result.turns}: the response has no output list")
        calls = [item for item in output if item.get("type") == "function_call"]
        if not calls:
            texts = [
                part.get("text", "")
                for item in output
                if item.get("type") == "message"
                for part in item.get("content") or ()
                if part.get("type") == "output_text"
            ]
            if not texts:
                raise RolloutError(
                    f"turn {result.turns}: the model answered with neither a tool call "
                    "nor a message"
                )
            result.answer = "".join(texts)
            return None
        if result.turns >= self.turns:
            raise RolloutError(
                f"the model still asks for a tool after {self.turns} turns; a rollout of "
                f"{self.turns} turns needs a reference server started with "
                f"tool_calls={self.turns - 1}"
            )
        result.tool_calls += len(calls)
        return [
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": tool_output(call["call_id"], self.tool_output_bytes),
            }
            for call in calls
        ]


def _describe_error(event: Mapping[str, Any], status: int | None = None) -> str:
    """One line out of an error envelope (socket `error` event or HTTP error body)."""
    error = event.get("error")
    if not isinstance(error, Mapping):
        error = {}
    status = status if status is not None else event.get("status")
    code = error.get("code") or error.get("type") or "error"
    message = error.get("message") or "no message"
    where = f" {status}" if status is not None else ""
    return f"{code}{where}: {message}"


def _terminal_response(event: dict[str, Any], turn: int) -> dict[str, Any]:
    """The response object of a terminal event, or RolloutError when it is not a success."""
    kind = event.get("type")
    if kind == "error":
        raise RolloutError(f"turn {turn}: the server answered an error: {_describe_error(event)}")
    response = event.get("response")
    if not isinstance(response, dict):
        raise RolloutError(f"turn {turn}: {kind} carries no response object")
    if kind != "response.completed":
        detail = response.get("error") or response.get("incomplete_details")
        reason = ""
        if isinstance(detail, dict):
            reason = str(detail.get("message") or detail.get("reason") or "")
        raise RolloutError(f"turn {turn}: the response ended with {kind}: {reason or 'no detail'}")
    return response


def _sse_events(lines: Iterator[str], turn: int) -> Iterator[dict[str, Any]]:
    """Decode an SSE stream's `data:` payloads (events are one `data:` line each)."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            payload = "\n".join(data)
            data.clear()
            if payload != "[DONE]":
                yield _loads(payload, turn)
    if data and data[0] != "[DONE]":
        yield _loads("\n".join(data), turn)


def _loads(payload: str | bytes, turn: int) -> dict[str, Any]:
    """One server event, decoded; RolloutError when it is not a JSON object."""
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise RolloutError(
            f"turn {turn}: the server sent an event that is not JSON: {exc}"
        ) from None
    if not isinstance(event, dict):
        raise RolloutError(f"turn {turn}: the server sent an event that is not a JSON object")
    return event


def run_http(
    base_url: str,
    *,
    turns: int,
    tool_output_bytes: int = 4096,
    model: str = "reference",
    tools: Sequence[Mapping[str, Any]] | None = DEFAULT_TOOLS,
    instructions: str | None = DEFAULT_INSTRUCTIONS,
    prompt: str = DEFAULT_PROMPT,
    path: str = DEFAULT_PATH,
    metadata: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    on_turn: TurnCallback | None = None,
) -> RolloutResult:
    """Run the rollout over plain HTTP, sending the whole history on every turn.

    ``base_url`` is the server's origin (``http://127.0.0.1:8000``); requests go to
    ``base_url + path``. Each turn is a ``stream: true`` POST read to its terminal event, on one
    keep-alive connection. Stops when the model answers with a message; raises
    :class:`RolloutError` on a non-200 answer, an error or failed event, a server that cannot be
    reached, or a model still asking for tools after ``turns`` turns.
    """
    _check_arguments(turns, tool_output_bytes)
    url = base_url.rstrip("/") + path
    fields = _request_fields(model, tools, instructions, metadata)
    result = RolloutResult(mode="http")
    agent = _Agent(result, turns, tool_output_bytes)
    history: list[dict[str, Any]] = [_user_message(prompt)]
    request_headers = {"content-type": "application/json", "accept": "text/event-stream"}
    request_headers.update(headers or {})
    # The client is built before the clock starts (httpx loads its TLS settings then); the
    # connection itself opens on the first turn and counts in it.
    client = httpx.Client(timeout=timeout, headers=request_headers)
    started = time.perf_counter()
    try:
        with client:
            while True:
                turn = result.turns + 1
                body = orjson.dumps({**fields, "stream": True, "input": history})
                sent_at = time.perf_counter()
                response, finished_at = _post_turn(client, url, body, turn)
                elapsed = finished_at - sent_at
                result.turn_seconds.append(elapsed)
                result.turn_bytes.append(len(body))
                if on_turn is not None:
                    on_turn(turn, elapsed)
                outputs = agent.step(response)
                if outputs is None:
                    # The rollout ends with the answer; closing the connection is not part of it.
                    result.total_seconds = time.perf_counter() - started
                    break
                history.extend(response["output"])
                history.extend(outputs)
    except httpx.TimeoutException as exc:
        raise RolloutError(f"no answer from {url} within {timeout:g} s: {exc}") from exc
    except httpx.TransportError as exc:
        raise RolloutError(f"could not talk to {url}: {exc or type(exc).__name__}") from exc
    return result


def _post_turn(
    client: httpx.Client, url: str, body: bytes, turn: int
) -> tuple[dict[str, Any], float]:
    """POST one turn and read its SSE stream; return the terminal event's response and the
    `perf_counter` time it arrived at."""
    with client.stream("POST", url, content=body) as answer:
        if answer.status_code != 200:
            raw = answer.read()
            try:
                envelope = orjson.loads(raw)
            except orjson.JSONDecodeError:
                envelope = {"error": {"message": raw[:500].decode(errors="replace")}}
            if not isinstance(envelope, dict):
                envelope = {}
            raise RolloutError(
                f"turn {turn}: the server answered HTTP {answer.status_code}: "
                f"{_describe_error(envelope, answer.status_code)}"
            )
        kind = answer.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            raise RolloutError(
                f"turn {turn}: expected an SSE stream (stream: true), got content-type {kind!r}"
            )
        terminal: dict[str, Any] | None = None
        finished_at = 0.0
        # Read the whole stream (nothing follows the terminal event, normally) so the
        # connection goes back to the pool; the turn's time stops at the terminal event.
        for event in _sse_events(answer.iter_lines(), turn):
            if terminal is None and event.get("type") in TERMINAL_EVENTS:
                finished_at = time.perf_counter()
                terminal = event
        if terminal is None:
            raise RolloutError(f"turn {turn}: the SSE stream ended without a terminal event")
    return _terminal_response(terminal, turn), finished_at


def _socket_url(base_url: str, path: str) -> str:
    url = base_url.rstrip("/") + path
    if url.startswith("https://"):
        return "wss://" + url.removeprefix("https://")
    if url.startswith("http://"):
        return "ws://" + url.removeprefix("http://")
    return url


def run_socket(
    base_url: str,
    *,
    turns: int,
    tool_output_bytes: int = 4096,
    model: str = "reference",
    tools: Sequence[Mapping[str, Any]] | None = DEFAULT_TOOLS,
    instructions: str | None = DEFAULT_INSTRUCTIONS,
    prompt: str = DEFAULT_PROMPT,
    path: str = DEFAULT_PATH,
    metadata: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    on_turn: TurnCallback | None = None,
) -> RolloutResult:
    """Run the rollout over one WebSocket mode connection, sending only the new items.

    ``base_url`` is the server's origin (``http://…``, ``https://…``, ``ws://…`` or
    ``wss://…``); the socket opens at ``base_url + path`` with the scheme made ``ws``/``wss``.
    Turn 1 sends the user message; each later turn sends a ``response.create`` with
    ``previous_response_id`` and only the tool outputs (plus the model, instructions and tools,
    which are not carried over). Raises :class:`RolloutError` like :func:`run_http`.
    """
    _check_arguments(turns, tool_output_bytes)
    url = _socket_url(base_url, path)
    fields = _request_fields(model, tools, instructions, metadata)
    result = RolloutResult(mode="socket")
    agent = _Agent(result, turns, tool_output_bytes)
    started = time.perf_counter()
    try:
        with connect(
            url,
            max_size=None,
            open_timeout=timeout,
            additional_headers=dict(headers or {}),
        ) as socket:
            message: dict[str, Any] = {
                "type": "response.create",
                **fields,
                "input": [_user_message(prompt)],
            }
            while True:
                turn = result.turns + 1
                frame = orjson.dumps(message)
                sent_at = time.perf_counter()
                socket.send(frame.decode())  # a text frame, as the protocol requires
                response = _receive_turn(socket, turn, timeout)
                elapsed = time.perf_counter() - sent_at
                result.turn_seconds.append(elapsed)
                result.turn_bytes.append(len(frame))
                if on_turn is not None:
                    on_turn(turn, elapsed)
                outputs = agent.step(response)
                if outputs is None:
                    # The rollout ends with the answer; closing the connection is not part of it.
                    result.total_seconds = time.perf_counter() - started
                    break
                message = {
                    "type": "response.create",
                    **fields,
                    "previous_response_id": result.response_ids[-1],
                    "input": outputs,
                }
    except ConnectionClosed as exc:
        raise RolloutError(f"the server closed the socket at {url}: {exc}") from exc
    except InvalidURI as exc:
        raise RolloutError(f"not a WebSocket URL: {url}") from exc
    except InvalidHandshake as exc:
        raise RolloutError(f"the server refused the WebSocket at {url}: {exc}") from exc
    except TimeoutError as exc:
        raise RolloutError(f"no answer from {url} within {timeout:g} s") from exc
    except OSError as exc:
        raise RolloutError(f"could not connect to {url}: {exc}") from exc
    return result


def _receive_turn(socket: Connection, turn: int, timeout: float) -> dict[str, Any]:
    """Read events up to this turn's terminal one."""
    while True:
        event = _loads(socket.recv(timeout=timeout), turn)
        if event.get("type") in TERMINAL_EVENTS:
            return _terminal_response(event, turn)
