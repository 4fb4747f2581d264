"""An agent rollout against a Responses server, over plain HTTP or over WebSocket mode.

The agent is the loop every coding agent runs: send the context, let the model ask for a tool,
run the tool, send its output, repeat until the model answers with a message. One rollout is
that loop for up to ``turns`` model calls. Against the reference server
(``ws_mode.toolkit.reference``, started with ``tool_calls=turns - 1``) the model asks for a tool on
every turn but the last.

Two drivers run the same rollout (:class:`~ws_mode.toolkit.agent.Agent` is the loop):

- :func:`run_http` posts ``stream: true`` requests to ``POST /v1/responses`` over one keep-alive
  connection, each carrying the whole history (the client keeps it: the previous context, the
  previous output, the new tool outputs), and reads the SSE stream to its terminal event;
- :func:`run_socket` opens one WebSocket at ``ws://…/v1/responses``, sends the user message
  first, then on every later turn only ``previous_response_id`` and the new tool outputs.

Both take the :class:`RolloutOptions`, return a :class:`RolloutResult` with per-turn wall times
and the bytes the client sent, and raise :class:`RolloutError` when the server answers an error.
The drivers are synchronous (the tools' clients: :class:`~ws_mode.toolkit.http_client.HttpClient`
and :class:`~ws_mode.testing._client.SyncSocket`); run them in threads for concurrent rollouts.

Needs the ``cli`` extra (``pip install ".[cli]"`` in a clone of ws_mode) for httpx and websockets.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Required, TypedDict, Unpack

import httpx
import orjson
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from ws_mode.testing._answers import IDS, Answer, difference, same
from ws_mode.testing._client import (
    FrameError,
    SocketClosed,
    SyncSocket,
    connect,
    ends_turn,
    socket_url,
)

from .agent import (
    DEFAULT_INSTRUCTIONS,
    DEFAULT_PATH,
    DEFAULT_PROMPT,
    DEFAULT_TOOLS,
    Agent,
    RolloutError,
    RolloutResult,
    TurnCallback,
    check_arguments,
    request_fields,
    terminal_response,
    tool_output,
    user_message,
)
from .http_client import HttpClient, HttpStatusError, NotAnEventStream, describe_error

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_PROMPT",
    "DEFAULT_TOOLS",
    "RolloutError",
    "RolloutOptions",
    "RolloutResult",
    "TurnCallback",
    "check_socket",
    "rollout_difference",
    "run_http",
    "run_rollout",
    "run_socket",
    "tool_output",
]


class RolloutOptions(TypedDict, total=False):
    """What a rollout sends, and how long it waits.

    Attributes:
        turns: the most model calls (required).
        tool_output_bytes: the size of each tool output (4096).
        model: the ``model`` of each request (``"reference"``).
        tools: the tools sent on every turn (:data:`DEFAULT_TOOLS`; None sends none).
        instructions: sent on every turn (:data:`DEFAULT_INSTRUCTIONS`; None sends none).
        prompt: the user message that starts the rollout (:data:`DEFAULT_PROMPT`).
        path: the server's Responses path (``/v1/responses``).
        metadata: the ``metadata`` of each request.
        headers: sent with every request, or on the socket's handshake.
        timeout: seconds to connect, and for each turn (60).
        on_turn: called after each turn (:data:`TurnCallback`).
        follow_ups: make the rollout a conversation: each time the model answers with a
            message before ``turns`` model calls, the next of these user messages (cycled) is
            sent; the rollout then makes exactly ``turns`` calls, ending after the last one
            whatever the model asked for (None: end at the model's first answer).
    """

    turns: Required[int]
    tool_output_bytes: int
    model: str
    tools: Sequence[Mapping[str, Any]] | None
    instructions: str | None
    prompt: str
    path: str
    metadata: Mapping[str, str] | None
    headers: Mapping[str, str] | None
    timeout: float
    on_turn: TurnCallback | None
    follow_ups: Sequence[str] | None


def _start(
    mode: Literal["http", "socket"], options: RolloutOptions
) -> tuple[RolloutResult, Agent, dict[str, Any]]:
    """Check the options; the empty result, its agent, and the fields every turn sends."""
    size = options.get("tool_output_bytes", 4096)
    check_arguments(options["turns"], size)
    fields = request_fields(
        options.get("model", "reference"),
        options.get("tools", DEFAULT_TOOLS),
        options.get("instructions", DEFAULT_INSTRUCTIONS),
        options.get("metadata"),
    )
    result = RolloutResult(mode=mode)
    agent = Agent(result, options["turns"], size, options.get("follow_ups"))
    return result, agent, fields


def run_http(base_url: str, **options: Unpack[RolloutOptions]) -> RolloutResult:
    """Run the rollout over plain HTTP, sending the whole history on every turn.

    ``base_url`` is the server's origin (``http://127.0.0.1:8000``); requests go to
    ``base_url + path``. Each turn is a ``stream: true`` POST read to its terminal event, on one
    keep-alive connection. Stops when the model answers with a message; raises
    :class:`RolloutError` on a non-200 answer, an error or failed event, a server that cannot be
    reached, or a model still asking for tools after ``turns`` turns.
    """
    result, agent, fields = _start("http", options)
    url = base_url.rstrip("/") + options.get("path", DEFAULT_PATH)
    timeout = options.get("timeout", 60.0)
    history: list[dict[str, Any]] = [user_message(options.get("prompt", DEFAULT_PROMPT))]
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    headers.update(options.get("headers") or {})
    # The client is built before the clock starts (httpx loads its TLS settings then); the
    # connection itself opens on the first turn and counts in it.
    client = HttpClient(timeout=timeout, headers=headers)

    def exchange(turn: int) -> tuple[dict[str, Any], int, float]:
        body = orjson.dumps({**fields, "stream": True, "input": history})
        sent_at = time.perf_counter()
        response, finished_at = _post_turn(client, url, body, turn)
        return response, len(body), finished_at - sent_at

    def advance(response: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
        history.extend(response["output"])
        history.extend(outputs)

    started = time.perf_counter()
    try:
        with client:
            agent.drive(exchange, advance, options.get("on_turn"), started)
    except httpx.TimeoutException as exc:
        raise RolloutError(f"no answer from {url} within {timeout:g} s: {exc}") from exc
    except httpx.TransportError as exc:
        raise RolloutError(f"could not talk to {url}: {exc or type(exc).__name__}") from exc
    return result


def _post_turn(
    client: HttpClient, url: str, body: bytes, turn: int
) -> tuple[dict[str, Any], float]:
    """POST one turn and read its SSE stream; return the terminal event's response and the
    `perf_counter` time it arrived at."""
    terminal: dict[str, Any] | None = None
    finished_at = 0.0
    try:
        # Read the whole stream (nothing follows the terminal event, normally) so the
        # connection goes back to the pool; the turn's time stops at the terminal event.
        for event in client.stream_events(url, body):
            if terminal is None and ends_turn(event):
                finished_at = time.perf_counter()
                terminal = event
    except HttpStatusError as exc:
        raise RolloutError(f"turn {turn}: the server answered {exc}", status=exc.status) from None
    except (NotAnEventStream, FrameError) as exc:
        raise RolloutError(f"turn {turn}: {exc}") from None
    if terminal is None:
        raise RolloutError(f"turn {turn}: the SSE stream ended without a terminal event")
    return terminal_response(terminal, turn), finished_at


def run_socket(base_url: str, **options: Unpack[RolloutOptions]) -> RolloutResult:
    """Run the rollout over one WebSocket mode connection, sending only the new items.

    ``base_url`` is the server's origin (``http://…``, ``https://…``, ``ws://…`` or
    ``wss://…``); the socket opens at ``base_url + path`` with the scheme made ``ws``/``wss``.
    Turn 1 sends the user message; each later turn sends a ``response.create`` with
    ``previous_response_id`` and only the tool outputs (plus the model, instructions and tools,
    which are not carried over). Raises :class:`RolloutError` like :func:`run_http`.
    """
    result, agent, fields = _start("socket", options)
    path = options.get("path", DEFAULT_PATH)
    url = socket_url(base_url, path)
    timeout = options.get("timeout", 60.0)
    prompt = user_message(options.get("prompt", DEFAULT_PROMPT))
    message: dict[str, Any] = {"type": "response.create", **fields, "input": [prompt]}
    started = time.perf_counter()
    with (
        _socket_errors(url, timeout),
        connect(base_url, path, headers=options.get("headers"), open_timeout=timeout) as socket,
    ):

        def exchange(turn: int) -> tuple[dict[str, Any], int, float]:
            sent_at = time.perf_counter()
            size = socket.send(message)  # a text frame, as the protocol requires
            response = _receive_turn(socket, turn, timeout)
            return response, size, time.perf_counter() - sent_at

        def advance(response: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
            message.update(previous_response_id=response["id"], input=outputs)

        agent.drive(exchange, advance, options.get("on_turn"), started)
    return result


def check_socket(
    base_url: str,
    path: str = DEFAULT_PATH,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    """Open a WebSocket mode connection like :func:`run_socket` and close it, sending nothing:
    :class:`RolloutError` (with the ``status`` of a refused handshake) when it cannot open."""
    url = socket_url(base_url, path)
    with (
        _socket_errors(url, timeout),
        connect(base_url, path, headers=headers, open_timeout=timeout),
    ):
        pass


@contextlib.contextmanager
def _socket_errors(url: str, timeout: float) -> Iterator[None]:
    """The socket's failures as :class:`RolloutError`."""
    try:
        yield
    except SocketClosed as exc:
        raise RolloutError(f"the server closed the socket at {url}: {exc}") from exc
    except InvalidURI as exc:
        raise RolloutError(f"not a WebSocket URL: {url}") from exc
    except InvalidStatus as exc:
        status = exc.response.status_code
        detail = _refusal(exc.response.body)
        raise RolloutError(
            f"the server refused the WebSocket at {url}: HTTP {status}{detail}", status=status
        ) from exc
    except InvalidHandshake as exc:
        raise RolloutError(f"the server refused the WebSocket at {url}: {exc}") from exc
    except TimeoutError as exc:
        raise RolloutError(f"no answer from {url} within {timeout:g} s") from exc
    except OSError as exc:
        raise RolloutError(f"could not connect to {url}: {exc}") from exc


def _refusal(body: bytes | bytearray | None) -> str:
    """What a refused handshake's body says: its error envelope's one line, or its text.
    (websockets types the body as bytes or None before 17, bytes or bytearray from 17 on.)"""
    if not body:
        return ""
    try:
        envelope = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f": {body[:200].decode(errors='replace').strip()}"
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), dict):
        return f" ({describe_error(envelope)})"
    return f": {body[:200].decode(errors='replace').strip()}"


def _receive_turn(socket: SyncSocket, turn: int, timeout: float) -> dict[str, Any]:
    """Read events up to this turn's terminal one; its response."""
    try:
        events = socket.receive_turn(timeout=timeout)
    except FrameError as exc:
        raise RolloutError(f"turn {turn}: {exc}") from None
    return terminal_response(events[-1], turn)


def rollout_difference(expected: RolloutResult, received: RolloutResult) -> str | None:
    """How ``received``'s answers differ from ``expected``'s, turn by turn (None when they do
    not): the first turn whose output differs, as the compatibility kit tells two answers
    apart (:func:`ws_mode.testing._answers.difference`; ids and ``call_id`` left out), or the
    number of turns when one rollout ended first."""
    for index, (want, got) in enumerate(zip(expected.outputs, received.outputs, strict=False)):
        over_http, socket = Answer("completed", want), Answer("completed", got)
        if not same(over_http, socket, IDS):
            return f"turn {index + 1}: " + difference(over_http, socket, IDS)
    if len(expected.outputs) != len(received.outputs):
        return (
            f"{expected.mode} made {len(expected.outputs)} model calls, "
            f"{received.mode} {len(received.outputs)}"
        )
    return None


def run_rollout(
    transport: Literal["http", "socket"], base_url: str, **options: Unpack[RolloutOptions]
) -> RolloutResult:
    """Run the rollout over ``transport``: :func:`run_http` or :func:`run_socket`."""
    runner = run_http if transport == "http" else run_socket
    return runner(base_url, **options)
