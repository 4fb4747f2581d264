"""A response's events read the same way on every path: the socket's `ResponseStream` and
stateful HTTP's pass-through share this tap, so both recognise the same events (by the data's
own `type`), echo `previous_response_id` the same way and keep the same finished response.
"""

from __future__ import annotations

import logging
from typing import Any, Final, NamedTuple

from orjson import JSONDecodeError, loads

from ._protocol import (
    FAILURE_EVENTS,
    RESPONSE_EVENTS,
    SUCCESS_EVENTS,
    TERMINAL_EVENTS,
    client_call_answer,
)

logger = logging.getLogger(__name__)


class ResponseTap:
    """What a response's events say about it, read the same way on every path (the socket's
    `ResponseStream`, stateful HTTP's pass-through).

    `decode` reads an event's data: its own `type` names it (the SSE `event:` line only stands
    in when it has none). `see` takes in each decoded event: the events that carry the response
    object get `previous_response_id` echoed, finished output items are kept (a terminal event
    may omit its output), the items started and not finished are known (`open_items`), and a
    terminal event says how the response ended (`finished`, `succeeded` with `response` and
    `output`, or `failure`), and its terminal response object (`terminal`: how many tokens it
    used, `Usage.of`, and which model answered).
    """

    __slots__ = (
        "client_calls",
        "failure",
        "finished",
        "items",
        "opened",
        "output",
        "previous_response_id",
        "response",
        "response_id",
        "started",
        "succeeded",
        "terminal",
        "usage",
    )

    def __init__(self, previous_response_id: str | None) -> None:
        self.previous_response_id = previous_response_id
        #: The response as its first event had it.
        self.started: dict[str, Any] | None = None
        self.response_id: str | None = None
        #: Finished output items by index.
        self.items: dict[int, dict[str, Any]] = {}
        #: The ids of the output items started (`response.output_item.added`), by index.
        self.opened: dict[int, Any] = {}
        #: The latest `usage` a response object of the stream reported (None: none did yet).
        self.usage: dict[str, Any] | None = None
        #: An item the client must answer is out.
        self.client_calls = False
        self.finished = False
        self.succeeded = False
        #: The finished response object, and its output items (filled from the finished items
        #: when the terminal event omitted them); None until it finished well.
        self.response: dict[str, Any] | None = None
        self.output: list[dict[str, Any]] | None = None
        #: The error code the response failed with (`response_failed` when it had none).
        self.failure: str | None = None
        #: The response object of the terminal event, however the response ended (None until
        #: then, and for an `error` event, which carries none).
        self.terminal: dict[str, Any] | None = None

    @staticmethod
    def decode(event_type: str | None, data: bytes) -> dict[str, Any] | None:
        """An event's data as an object whose `type` is its kind, or None when it is no JSON
        object."""
        try:
            event = loads(data)
        except JSONDecodeError:
            return None
        if type(event) is not dict:
            return None
        if "type" not in event and event_type is not None:
            event["type"] = event_type
        return event

    def see(self, event: dict[str, Any]) -> bool:
        """Take in one decoded event; True when it carries the response object and the echo
        of `previous_response_id` changed it."""
        kind = event.get("type")
        if kind == "response.output_item.done":
            self.remember_item(event)
            return False
        if kind == "response.output_item.added":
            self.item_added(event)
            return False
        changed = False
        response = None
        if kind in RESPONSE_EVENTS:
            response = event.get("response")
            if isinstance(response, dict):
                parent = self.previous_response_id
                changed = response.get("previous_response_id", _ABSENT) != parent
                response["previous_response_id"] = parent
                if isinstance(response.get("id"), str):
                    self.response_id = response["id"]
                if self.started is None:
                    self.started = response
                usage = response.get("usage")
                if isinstance(usage, dict):
                    self.usage = usage
                if kind in TERMINAL_EVENTS:
                    self.terminal = response
        if kind in SUCCESS_EVENTS:
            self._succeed(response)
        elif kind in FAILURE_EVENTS:
            self.finished = True
            self.failure = _failure_code(event)
        return changed

    def echo_unchanged(self, event: dict[str, Any]) -> bool:
        """Whether `see` leaves `event`, one that carries the response object, as it is: the
        object already says the client's `previous_response_id` (or there is none to echo
        into). Such an event may be forwarded as it was encoded."""
        response = event.get("response")
        return (
            not isinstance(response, dict)
            or response.get("previous_response_id", _ABSENT) == self.previous_response_id
        )

    def remember_item(self, event: dict[str, Any]) -> None:
        """Keep the item of a `response.output_item.done`."""
        item, index = event.get("item"), event.get("output_index")
        if isinstance(item, dict):
            if client_call_answer(item) is not None:
                self.client_calls = True
            self.items[index if isinstance(index, int) else len(self.items)] = item

    def item_added(self, event: dict[str, Any]) -> None:
        """Note the item a `response.output_item.added` starts."""
        item, index = event.get("item"), event.get("output_index")
        if isinstance(index, int):
            self.opened[index] = item.get("id") if isinstance(item, dict) else None

    def open_items(self) -> list[tuple[int, Any]]:
        """The output items started and not finished: their index and id, in order."""
        return [
            (index, self.opened[index]) for index in sorted(self.opened) if index not in self.items
        ]

    def items_so_far(self) -> list[dict[str, Any]]:
        """The finished output items, in order."""
        return [self.items[index] for index in sorted(self.items)]

    def _succeed(self, response: Any) -> None:
        self.finished = True
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            logger.warning("a terminal event had no response id; the response is not kept")
            return
        output = response.get("output")
        if self.items:
            # What the client received item by item is what it builds its history from
            # (Codex does): where the terminal's list disagrees, the streamed items win.
            streamed = self.items_so_far()
            if streamed != output:
                output = streamed
        elif not isinstance(output, list):
            output = []
        self.succeeded = True
        self.response = response
        if not all(type(item) is dict for item in output):
            output = [item for item in output if isinstance(item, dict)]
        # Most often the response's own list, shared (nothing changes either): a cached
        # response keeps one container fewer for the garbage collector to walk.
        self.output = output


_ABSENT = object()

#: A token count above this is no count (JSON's largest exact integer): a handler's or an
#: upstream's nonsense is not summed into counters that must stay JSON numbers.
_MAX_COUNT: Final = 2**53


class Usage(NamedTuple):
    """The tokens one response used, as its `usage` reports them: `input_tokens` (of which
    `cached_tokens` were read from the provider's cache: `input_tokens_details.cached_tokens`)
    and `output_tokens` (of which `reasoning_tokens` reasoned:
    `output_tokens_details.reasoning_tokens`). A count missing, null, negative, not an integer
    (a float, a string, a bool) or past 2**53 is 0.

    The metrics, the spans and the access log count these, and an `on_response` hook gets the
    same as `Turn.usage`: what it bills is what they count."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def cache_ratio(self) -> float | None:
        """The share of the input read from the provider's prompt cache (`cached_tokens /
        input_tokens`, at most 1); None without input tokens."""
        if self.input_tokens <= 0:
            return None
        return min(1.0, self.cached_tokens / self.input_tokens)

    @classmethod
    def of(cls, response: dict[str, Any]) -> Usage | None:
        """The usage a response object reports; None when it reports none (`usage` absent or
        null, as a response that ended before the model counted anything has it)."""
        usage = response.get("usage")
        if type(usage) is not dict:
            return None
        read = usage.get("input_tokens_details")
        reasoned = usage.get("output_tokens_details")
        return cls(
            _count(usage.get("input_tokens")),
            _count(read.get("cached_tokens")) if type(read) is dict else 0,
            _count(usage.get("output_tokens")),
            _count(reasoned.get("reasoning_tokens")) if type(reasoned) is dict else 0,
        )


def _count(value: object) -> int:
    return value if type(value) is int and 0 <= value <= _MAX_COUNT else 0


def _failure_code(event: dict[str, Any]) -> str:
    """The code of an `error` event (nested envelope) or of a failed response's error."""
    if event.get("type") == "error":
        error = event.get("error")
    else:
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else "response_failed"
