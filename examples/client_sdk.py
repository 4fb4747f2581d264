"""An agent loop over WebSocket mode with the official `openai` SDK.

Start a server, then point the client at it:

    uvicorn examples.fastapi_app:app --ws ws_mode.server:BatchingWebSocketProtocol
    # or examples.starlette_app:app, which calls tools
    python examples/client_sdk.py --base-url http://127.0.0.1:8000/v1 "What time is it?" "Thanks"

It works the same against OpenAI itself (`--base-url https://api.openai.com/v1 --model <model>`
with OPENAI_API_KEY set). Needs `pip install "openai[realtime]"`.

What it shows:
- one socket for the whole conversation, `client.responses.connect()`;
- a `generate: False` warm-up that sends the tools and the standing context before the first
  question, so the first real turn only adds the question;
- every turn sends only the new items (the question, or the outputs of the tools the model
  called) with `previous_response_id`; the server keeps the rest;
- a named lane (`stream_id`): every event of the lane's responses carries it;
- the documented recovery when the server no longer has the previous response
  (`previous_response_not_found`): send the whole context again, without the id;
- what a client must do when a restart closes its socket (uvicorn's close 1012, a drain's
  1001, a turn refused with `server_shutting_down`): open a new socket and send the turn again
  with the whole context and `previous_response_id` null, since the server the new socket
  reaches may not have the id (examples/client_resume.py continues from the id instead, for
  servers that share a store).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, TextIO

from openai import OpenAI, omit
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses import FunctionToolParam, Response
from openai.types.websocket_reconnection import is_recoverable_close
from websockets.exceptions import ConnectionClosed, InvalidStatus

Item = dict[str, Any]

INSTRUCTIONS = "You are a terse assistant. Use the tools when they help."
BACKGROUND = "The user works in UTC and wants short answers."
TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "get_time",
        "description": "The current date and time in UTC.",
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "additionalProperties": False,
        },
        "strict": False,
    }
]


def run_tool(name: str, arguments: str) -> str:
    """Run one function call locally; its result goes back to the model as text."""
    if name == "get_time":
        return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return json.dumps({"error": f"unknown tool {name!r}", "arguments": arguments})


class TurnFailed(Exception):
    """A response ended in an error event, `response.failed` or `response.incomplete`."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class SocketLost(Exception):
    """The socket closed (or a new one could not open) before the turn's answer came."""


#: Errors a server sends right before it closes the socket with 1001: the turn was not run.
CLOSING_ERRORS = frozenset({"server_shutting_down", "websocket_connection_limit_reached"})


class Agent:
    """One conversation on one lane of a WebSocket mode connection. Given `reconnect` (a
    function opening a new connection), it comes back after its socket is closed."""

    def __init__(
        self,
        connection: ResponsesConnection,
        *,
        model: str,
        stream_id: str = "agent",
        out: TextIO = sys.stdout,
        max_steps: int = 8,
        reconnect: Callable[[], ResponsesConnection] | None = None,
        attempts: int = 6,
    ) -> None:
        self.connection = connection
        self.model = model
        self.stream_id = stream_id
        self.out = out
        self.max_steps = max_steps
        self.reconnect = reconnect
        self.attempts = attempts
        #: How many times a turn was sent again on a new socket.
        self.reconnects = 0
        #: The id every next turn continues from.
        self.last_id: str | None = None
        #: The whole conversation, kept only to recover when the server lost its state.
        self.context: list[Item] = []

    def warm_up(self) -> Response:
        """Send tools and standing context without generating; later turns continue from it."""
        background = {"role": "developer", "content": BACKGROUND}
        return self.turn([background], generate=False)

    def ask(self, question: str) -> str:
        """One user question, with as many tool round trips as the model asks for."""
        items: list[Item] = [{"role": "user", "content": question}]
        for _ in range(self.max_steps):
            response = self.turn(items)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return response.output_text
            items = []
            for call in calls:
                result = run_tool(call.name, call.arguments)
                print(f"[tool] {call.name}({call.arguments}) -> {result}", file=self.out)
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": result}
                )
        raise RuntimeError(f"no answer after {self.max_steps} model calls")

    def turn(self, new_items: list[Item], *, generate: bool = True) -> Response:
        """Send the new items, continuing from the last response; wait for this one."""
        try:
            response = self._run(new_items, self.last_id, generate)
        except SocketLost:
            if self.reconnect is None:
                raise
            response = self._run_again(new_items, generate)
        self.context += new_items
        self.context += [item.to_dict() for item in response.output]
        self.last_id = response.id
        return response

    def _run(self, new_items: list[Item], previous_id: str | None, generate: bool) -> Response:
        self._send(new_items, previous_id, generate)
        try:
            return self._wait()
        except TurnFailed as failure:
            if failure.code != "previous_response_not_found" or previous_id is None:
                raise
            # The server no longer has our state (a new connection, another worker, an evicted
            # cache entry): the documented recovery is the whole context, without the id.
            print("[recovering: resending the whole context]", file=self.out)
            self._send(self.context + new_items, None, generate)
            return self._wait()

    def _run_again(self, new_items: list[Item], generate: bool) -> Response:
        """The socket closed before the answer (a restart's 1012, a drain's 1001): the turn
        died with it. Open a new socket and send the turn again with the whole context and no
        `previous_response_id`: the server it reaches may not have the id. Wait a little
        longer before each attempt (a restart may refuse connections for a moment)."""
        assert self.reconnect is not None
        for attempt in range(1, self.attempts + 1):
            time.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))
            self.close()
            print("[socket closed: resending the whole context on a new one]", file=self.out)
            try:
                with _socket_losses():
                    self.connection = self.reconnect()
                self.reconnects += 1
                return self._run(self.context + new_items, None, generate)
            except SocketLost:
                if attempt == self.attempts:
                    raise
        raise AssertionError("unreachable")  # every attempt returns or raises

    def close(self) -> None:
        """Close the socket (it may be closed already)."""
        with suppress(ConnectionClosed, OSError):
            self.connection.close()

    def _send(self, items: list[Item], previous_id: str | None, generate: bool) -> None:
        with _socket_losses():
            self._create(items, previous_id, generate)

    def _create(self, items: list[Item], previous_id: str | None, generate: bool) -> None:
        self.connection.response.create(
            model=self.model,
            instructions=INSTRUCTIONS,  # never inherited from the previous response: every turn
            tools=TOOLS,  # clients send the tools on every turn too
            input=items,  # type: ignore[arg-type]
            previous_response_id=previous_id if previous_id is not None else omit,
            generate=generate,
            stream_id=self.stream_id,
            store=False,
        )

    def _wait(self) -> Response:
        """Print the text as it streams; return the finished response."""
        with _socket_losses():
            return self._events()

    def _events(self) -> Response:
        streamed = False
        for event in self.connection:
            lane = getattr(event, "stream_id", None)
            if lane is not None and lane != self.stream_id:
                continue  # another lane of the same connection
            if event.type == "response.output_text.delta":
                self.out.write(event.delta)
                self.out.flush()
                streamed = True
            elif event.type == "response.completed":
                text = event.response.output_text
                if text:  # a server may send the text only in the finished response
                    print("" if streamed else text, file=self.out)
                return event.response
            elif event.type == "error":
                if event.error.code in CLOSING_ERRORS:  # a close with 1001 follows
                    raise SocketLost(event.error.code)
                raise TurnFailed(event.error.code, event.error.message)
            elif event.type in ("response.failed", "response.incomplete"):
                raise TurnFailed(event.type, str(event.response.error or event.response.status))
        # The loop ends without an exception after a close with 1001 (a drain).
        raise SocketLost("the server closed the connection")


@contextmanager
def _socket_losses() -> Iterator[None]:
    """A close with a code worth coming back after (1001, 1006, 1011, 1012...), or a new
    socket that could not open yet, as SocketLost; other closes (1008, 1009) and refusals
    (401, 403...) as they are."""
    try:
        yield
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else 1006
        if not is_recoverable_close(code):
            raise
        raise SocketLost(f"close {code}") from closed
    except InvalidStatus as refused:  # a draining server (503), a proxy with no upstream yet
        if refused.response.status_code not in (502, 503, 504):
            raise
        raise SocketLost(f"connect: HTTP {refused.response.status_code}") from refused
    except OSError as exc:  # connection refused: every server restarting
        raise SocketLost(f"connect: {type(exc).__name__}") from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    parser.add_argument("--model", default="scripted")
    parser.add_argument("--stream-id", default="agent")
    parser.add_argument("questions", nargs="*", default=["What time is it?", "Thank you!"])
    args = parser.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "-"))

    def connect() -> ResponsesConnection:  # ws://…/v1/responses
        return client.responses.connect().enter()

    agent = Agent(connect(), model=args.model, stream_id=args.stream_id, reconnect=connect)
    try:
        warm = agent.warm_up()
        print(f"[warmed up: {warm.id}]")
        for question in args.questions:
            print(f"> {question}")
            agent.ask(question)
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
