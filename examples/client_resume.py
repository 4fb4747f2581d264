"""A client that comes back: an agent loop over WebSocket mode, with the official `openai` SDK,
that survives the death of the server's worker in the middle of a turn.

Run a server with several workers and a store they share, start the client, then kill the
worker that serves it (or restart them all) while it runs:

    redis-server --port 6379 --appendonly yes &
    ws-mode serve --workers 2 --store redis://127.0.0.1:6379/0 --tokens-per-second 10
    python examples/client_resume.py --base-url http://127.0.0.1:8000/v1 "Plan the release"
    kill -9 <a worker's pid>        # or kill -HUP <ws-mode serve's pid>: a rolling restart

Needs `pip install "openai[realtime]"`.

Why it is needed: the SDK's own reconnection (`client.responses.connect(on_reconnecting=...)`)
opens a new socket after a close it counts as recoverable, and sends what was queued while it
reconnected. The turn that was running on the old socket is gone with it: nothing on the new
socket ever answers it, and a loop waiting for that turn's events waits forever. This client
does that part itself, without the SDK's reconnection:

- when the socket closes before the turn's terminal event (with a code the SDK would reconnect
  on: a killed worker's 1006, a restart's 1012, a drain's 1001), when the server refuses the
  turn because it is shutting down (`server_shutting_down`, then 1001), or when a new socket
  cannot open yet, the turn is sent again on a new socket: the same input, with the
  `previous_response_id` of the last response it *received*;
- with a store every worker shares (`ws-mode serve --store redis://...`, or
  `WebSocketModeMiddleware(store=RedisStore(...))`), the new socket continues from that id on
  whichever worker it reaches. Without one (or after the store lost the response) the server
  answers `previous_response_not_found`, and the client sends the whole context again, without
  the id: the documented recovery;
- a turn is sent at most `attempts` times, each wait twice as long as the one before; each
  resend is recorded (`agent.resends`, printed at the end) with what caused it.

A turn sent again may run twice on the server (when only its answer was lost on the way): the
client goes on from the response it received. Tools run on the client, once per answer it
received, never again for a resend: a resend carries the same tool outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO

from openai import OpenAI, omit
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses import FunctionToolParam, Response, ResponsesServerEvent
from openai.types.websocket_reconnection import is_recoverable_close
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

Item = dict[str, Any]
#: Called with every event the agent receives (to log progress, or to test a worker's death).
EventHook = Callable[[ResponsesServerEvent], None]

INSTRUCTIONS = "You plan software releases. Look things up before you answer."
TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look up a fact about the release.",
        "parameters": {
            "type": "object",
            "properties": {"step": {"type": "integer"}},
            "additionalProperties": True,
        },
        "strict": False,
    }
]
#: What `lookup` finds, by step (a real agent would read files or call services).
FACTS = ["the branch is cut", "CI is green", "the changelog is written", "the tag is signed"]
#: HTTP statuses of a refused handshake worth another try: a draining ws_mode (503), a proxy
#: with no upstream yet (502, 503, 504). A 426 is not one: WebSocket mode is off there, and a
#: client falls back to HTTP.
RETRY_STATUSES = frozenset({502, 503, 504})


def run_tool(name: str, arguments: str) -> str:
    """Run one function call locally; its result goes back to the model as text."""
    if name != "lookup":
        return json.dumps({"error": f"unknown tool {name!r}"})
    step = json.loads(arguments or "{}").get("step", 1)
    return FACTS[(int(step) - 1) % len(FACTS)]


class TurnFailed(Exception):
    """A response ended in an error event, `response.failed` or `response.incomplete`."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class SocketLost(Exception):
    """The socket closed, or could not open, before the turn's terminal event: the turn is
    sent again on a new socket."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass(frozen=True)
class Resend:
    """One turn sent again: which model call of the conversation (from 1), which attempt at it
    failed (from 1), why (`close 1006`, `server_shutting_down`, `connect: ...`), and whether
    the server had begun it (`response.created` came) before the socket was lost."""

    turn: int
    attempt: int
    cause: str
    begun: bool = False


class ResumingAgent:
    """A tool-calling conversation over WebSocket mode that resends the turn in flight on a new
    socket when its socket is lost. Use it in a `with` block (it closes its socket)."""

    def __init__(
        self,
        client: OpenAI,
        *,
        model: str,
        attempts: int = 6,
        first_delay: float = 0.25,
        max_delay: float = 4.0,
        on_event: EventHook | None = None,
        out: TextIO = sys.stdout,
    ) -> None:
        self.client = client
        self.model = model
        self.attempts = attempts
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.on_event = on_event
        self.out = out
        #: The id every next turn continues from: the last response received.
        self.last_id: str | None = None
        #: The whole conversation, kept only for when the server no longer has `last_id`.
        self.context: list[Item] = []
        #: Model calls so far, every resend, and the turns the server could not continue
        #: (`previous_response_not_found`), sent again with the whole context.
        self.turns = 0
        self.resends: list[Resend] = []
        self.whole_context_sends = 0
        self._connection: ResponsesConnection | None = None
        self._begun = False

    def __enter__(self) -> ResumingAgent:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket, if one is open."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with suppress(ConnectionClosed, OSError):  # it was lost already
                connection.close()

    def start_over(self) -> None:
        """Begin a new conversation, on the same socket."""
        self.last_id = None
        self.context = []

    def ask(self, question: str, max_steps: int = 16) -> Response:
        """One user question, with as many tool round trips as the model asks for; the final
        response."""
        items: list[Item] = [{"role": "user", "content": question}]
        for _ in range(max_steps):
            response = self.turn(items)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return response
            items = []
            for call in calls:
                result = run_tool(call.name, call.arguments)
                print(f"[tool] {call.name}({call.arguments}) -> {result}", file=self.out)
                items.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": result}
                )
        raise RuntimeError(f"no answer after {max_steps} model calls")

    def turn(self, new_items: list[Item]) -> Response:
        """Send the new items after the last response received, on the open socket or a new
        one, until a response to them arrives; that response."""
        self.turns += 1
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._run(new_items)
            except SocketLost as lost:
                self.close()
                if attempt == self.attempts:
                    raise ConnectionError(
                        f"turn {self.turns} not answered in {attempt} attempts: {lost}"
                    ) from lost
                self.resends.append(Resend(self.turns, attempt, lost.cause, self._begun))
                print(f"[{lost.cause}: turn {self.turns} again, on a new socket]", file=self.out)
                time.sleep(min(self.first_delay * 2 ** (attempt - 1), self.max_delay))
                continue
            self.context += new_items
            self.context += [item.to_dict() for item in response.output]
            self.last_id = response.id
            return response
        raise AssertionError("unreachable")  # every attempt returns, continues or raises

    def _run(self, new_items: list[Item]) -> Response:
        """One attempt at a turn. SocketLost when the socket is lost on the way."""
        self._begun = False
        connection = self._open()
        self._send(connection, new_items, self.last_id)
        try:
            return self._wait(connection)
        except TurnFailed as failure:
            if failure.code != "previous_response_not_found" or self.last_id is None:
                raise
            # The server no longer has the state (no shared store, or the store lost it):
            # the documented recovery is the whole context, without the id.
            print("[previous response not found: sending the whole context]", file=self.out)
            self.whole_context_sends += 1
            self._send(connection, self.context + new_items, None)
            return self._wait(connection)

    def _open(self) -> ResponsesConnection:
        """The open socket, or a new one (the SDK's reconnection off: a lost socket raises)."""
        if self._connection is None:
            try:
                self._connection = self.client.responses.connect().enter()
            except InvalidStatus as refused:
                status = refused.response.status_code
                if status not in RETRY_STATUSES:
                    raise
                raise SocketLost(f"connect: HTTP {status}") from refused
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                raise SocketLost(f"connect: {type(exc).__name__}") from exc
        return self._connection

    def _send(
        self, connection: ResponsesConnection, items: list[Item], previous_id: str | None
    ) -> None:
        with _socket_losses():
            connection.response.create(
                model=self.model,
                instructions=INSTRUCTIONS,  # never inherited from the previous response
                tools=TOOLS,
                input=items,  # type: ignore[arg-type]
                previous_response_id=previous_id if previous_id is not None else omit,
                store=True,  # what lets another worker continue from this response
            )

    def _wait(self, connection: ResponsesConnection) -> Response:
        """Print the text as it streams; return the finished response."""
        streamed = False
        while True:
            with _socket_losses():
                event = connection.recv()
            if self.on_event is not None:
                self.on_event(event)
            if event.type == "response.created":
                self._begun = True
            elif event.type == "response.output_text.delta":
                self.out.write(event.delta)
                self.out.flush()
                streamed = True
            elif event.type == "response.completed":
                text = event.response.output_text
                if text:  # a server may send the text only in the finished response
                    print("" if streamed else text, file=self.out)
                return event.response
            elif event.type == "error":
                if event.error.code == "server_shutting_down":  # a 1001 close follows
                    raise SocketLost("server_shutting_down")
                raise TurnFailed(event.error.code, event.error.message)
            elif event.type in ("response.failed", "response.incomplete"):
                raise TurnFailed(event.type, str(event.response.error or event.response.status))


@contextmanager
def _socket_losses() -> Iterator[None]:
    """A socket closed with a code the SDK itself would reconnect on (no close frame at all is
    1006) as SocketLost; other closes (a policy violation, a message too big: sending again
    would not help) as they are."""
    try:
        yield
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd is not None else 1006
        if not is_recoverable_close(code):
            raise
        raise SocketLost(f"close {code}") from closed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    parser.add_argument("--model", default="scripted")
    parser.add_argument("--attempts", type=int, default=6, help="sends of one turn at most")
    parser.add_argument("questions", nargs="*", default=["Plan the release."])
    args = parser.parse_args(argv)

    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "-"))
    with ResumingAgent(client, model=args.model, attempts=args.attempts) as agent:
        for question in args.questions:
            print(f"> {question}")
            agent.ask(question)
    print(f"[{agent.turns} turns, {len(agent.resends)} sent again]")
    for resend in agent.resends:
        begun = ", begun on the server" if resend.begun else ""
        print(f"[turn {resend.turn}, attempt {resend.attempt}: {resend.cause}{begun}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
