"""The answers side of the comparison: what a turn answered over the socket, what the same
conversation answers over plain HTTP with the full history, how two answers differ, and the
check of each turn's answer (`AnswerCheck`).

An answer is its class (a response with its terminal status, or an error with its HTTP status)
and its output items. Ids differ legitimately between two calls (a response's, an item's, a
tool call's `call_id`), so they are left out of the comparison, with any field the check was
told the handler randomizes.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .._protocol import TERMINAL_EVENT_BY_STATUS
from .._settings import FullContext
from .._sse import SSEDecoder
from ._diff import short
from ._expected import UNKNOWN_CALL_ID, Plan
from ._items import Item, as_items
from ._program import Step
from ._report import NONDETERMINISM_HINT, NotDeterministic, TurnFailed

#: Fields of output items that legitimately differ from one call to the next.
IDS = frozenset({"id", "call_id"})


@dataclass(frozen=True)
class Answer:
    """One answer: `status` is the terminal status (`completed`, `incomplete`, `failed`) or
    the HTTP status of an error; `output` its output items (none for an error)."""

    status: str | int
    output: list[Item]
    #: The error's body (or the answer that was not a response), for failure messages.
    detail: Any = None

    @property
    def refused(self) -> bool:
        return isinstance(self.status, int)

    def describe(self) -> str:
        if self.refused:
            return f"error {self.status}" + (f": {short(self.detail, 160)}" if self.detail else "")
        kinds = ", ".join(str(item.get("type")) for item in self.output) or "no output"
        return f"{self.status} [{kinds}]"


def socket_answer(events: list[dict[str, Any]], output: list[Item]) -> Answer:
    """The answer of a turn whose events were checked, with its `output`."""
    last = events[-1]
    if last["type"] == "error":
        status = last.get("status")
        return Answer(status if isinstance(status, int) else 500, [], last.get("error"))
    response = last.get("response") or {}
    return Answer(str(response.get("status")), output)


def http_answer(
    base_url: str,
    path: str,
    headers: Mapping[str, str],
    body: dict[str, Any],
    timeout: float,
) -> Answer:
    """POST `body` to the served app at `path` and read its answer: a JSON response object or
    an event stream ending with a terminal event; any status >= 400 is a refusal."""
    url = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        sent = {**headers, "content-type": "application/json", "accept": "text/event-stream"}
        connection.request("POST", path, body=orjson.dumps(body), headers=sent)
        answer = connection.getresponse()
        raw = answer.read()
        kind = answer.getheader("content-type") or ""
    finally:
        connection.close()
    if answer.status >= 400:
        try:
            detail: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            detail = raw.decode("utf-8", "replace")
        error = detail.get("error") if isinstance(detail, dict) else None
        return Answer(answer.status, [], error if error is not None else detail)
    if "text/event-stream" in kind:
        return _stream_answer(raw)
    try:
        response = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Answer("(not JSON)", [], raw[:200].decode("utf-8", "replace"))
    return _response_answer(response, {})


def _stream_answer(raw: bytes) -> Answer:
    """The answer an SSE stream gave: its last terminal event's response."""
    done: dict[int, Item] = {}
    terminal: dict[str, Any] | None = None
    for _, data in SSEDecoder().feed(raw + b"\n\n"):  # a stream cut short still ends
        if not data or data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            index = event.get("output_index")
            done[index if isinstance(index, int) else len(done)] = event["item"]
        elif kind in TERMINAL_EVENT_BY_STATUS.values() or kind == "error":
            terminal = event
    if terminal is None:
        return Answer("(no terminal event)", [], raw[-200:].decode("utf-8", "replace"))
    if terminal.get("type") == "error":
        status = terminal.get("status")
        error = terminal.get("error", terminal)
        return Answer(status if isinstance(status, int) else 500, [], error)
    return _response_answer(terminal.get("response"), done)


def _response_answer(response: Any, done: dict[int, Item]) -> Answer:
    if not isinstance(response, dict):
        return Answer("(no response object)", [], response)
    output = response.get("output")
    if not isinstance(output, list) or (not output and done):
        output = [done[index] for index in sorted(done)]
    return Answer(str(response.get("status")), output)


def comparable(items: list[Item], ignored: Collection[str]) -> Any:
    """`items` without the fields named `ignored`, at any depth."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: strip(inner) for key, inner in value.items() if key not in ignored}
        if isinstance(value, list):
            return [strip(inner) for inner in value]
        return value

    return strip(items)


def same(first: Answer, second: Answer, ignored: Collection[str]) -> bool:
    """Whether two answers are of one class (status) with equal output, `ignored` left out."""
    if first.status != second.status:
        return False
    return first.refused or comparable(first.output, ignored) == comparable(second.output, ignored)


def difference(expected: Answer, received: Answer, ignored: Collection[str]) -> str:
    """How the socket's answer (`received`) differs from HTTP's (`expected`): their classes,
    and the first output item that differs (`ignored` fields left out)."""
    lines = [f"HTTP answered {expected.describe()}; the socket {received.describe()}"]
    if expected.status != received.status or expected.refused:
        return lines[0]
    over_http = comparable(expected.output, ignored)
    socket = comparable(received.output, ignored)
    for index, (want, got) in enumerate(zip(over_http, socket, strict=False)):
        if want != got:
            lines.append(f"first difference at output item {index}:")
            lines.append(f"  HTTP:   {short(want)}")
            lines.append(f"  socket: {short(got)}")
            return "\n".join(lines)
    lines.append(f"HTTP's output has {len(over_http)} items, the socket's {len(socket)}")
    return "\n".join(lines)


class AnswerCheck:
    """Checks each turn's answer against the same conversation over plain HTTP with the full
    history, asked through `ask`. `compare` (else only an unknown call's output must be
    refused), `ignored` (fields left out), `require_history` and `mode` (the middleware's
    `full_context`, for hints) are the check's options."""

    def __init__(
        self,
        ask: Callable[[dict[str, Any]], Answer],
        *,
        compare: bool,
        ignored: Collection[str],
        require_history: bool,
        mode: FullContext | None,
    ) -> None:
        self.ask = ask
        self.compare = compare
        self.ignored = ignored
        self.require_history = require_history
        self.mode = mode

    def check(self, step: Step, plan: Plan, socket: Answer, handler_called: bool) -> bool:
        """Raise `TurnFailed` unless the turn's `socket` answer is HTTP's; return whether it
        was compared. Wrong input must be answered as HTTP answers it, and an output for an
        unknown call refused in any case (the API answers 400). A turn ws_mode refused before
        calling the handler (`handler_called` false) has no HTTP counterpart."""
        if not step.generate:
            return False  # a warm-up has no HTTP counterpart
        if plan.wrong == "unknown_call" and not socket.refused:
            raise TurnFailed(
                "the socket accepted a function_call_output whose call_id matches no call "
                "(the API refuses it: 400, 'No tool call found for function call output')",
                f"call_id {UNKNOWN_CALL_ID!r}; the socket answered {socket.describe()}",
            )
        if not self.compare or (not handler_called and plan.wrong is None):
            return False
        over_http = self.ask(plan.http_request())
        if plan.wrong == "unknown_call" and not over_http.refused:
            raise TurnFailed(
                "the handler accepted a function_call_output whose call_id matches no call "
                "over plain HTTP too (the API refuses it: 400, 'No tool call found for "
                "function call output')",
                f"call_id {UNKNOWN_CALL_ID!r}; HTTP answered {over_http.describe()}",
            )
        if not same(over_http, socket, self.ignored):
            self._differs(plan, over_http, socket)
        if (
            self.require_history
            and plan.wrong is None
            and plan.request.get("previous_response_id") is not None
            and len(plan.context) > len(as_items(plan.request["input"]))  # there is history
            and not over_http.refused
        ):
            alone = self.ask(plan.http_request(history=False))
            if same(alone, over_http, self.ignored):
                raise TurnFailed(
                    "the handler's answer does not depend on the earlier turns "
                    "(require_history=True): over HTTP, the new input alone gets the same "
                    "answer as the whole history",
                    f"both answered {over_http.describe()}; "
                    f"the history holds {len(plan.context)} items",
                )
        return True

    def _differs(self, plan: Plan, over_http: Answer, socket: Answer) -> None:
        """The socket's answer differs from HTTP's: ask HTTP twice more to tell a handler
        that is not deterministic from one that answers the socket differently."""
        again = [self.ask(plan.http_request()) for _ in range(2)]
        if any(
            same(answer, socket, self.ignored) or not same(answer, over_http, self.ignored)
            for answer in again
        ):
            answers = "; ".join(answer.describe() for answer in [over_http, *again])
            raise NotDeterministic(
                "the handler is not deterministic: it answered the same request differently "
                "from one call to the next, so its socket answers cannot be compared with HTTP's",
                f"the socket answered {socket.describe()}; HTTP answered {answers}\n"
                + NONDETERMINISM_HINT,
            )
        hint = ""
        if plan.wrong is not None:
            hint = f"\nthe turn sent wrong input ({plan.wrong}): answer it as HTTP does"
        elif self.mode == "on_miss" and plan.request.get("previous_response_id"):
            hint = (
                "\nfull_context='on_miss': on a cache hit the body holds only the new input; "
                "a cache-aware handler must read the history from ws_mode.turn(request)"
            )
        raise TurnFailed(
            "the socket's answer differs from HTTP's for the same conversation with the full "
            "history (HTTP answered the same way 3 times)",
            difference(over_http, socket, self.ignored) + hint,
        )
