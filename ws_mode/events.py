"""A response's events on their way to the socket, and the events of a finished response.

Every event is checked to be a JSON object (a handler that sends anything else gets an error
event for its turn), but most go out as the handler encoded them: the SSE `event:` line names
the type, and a lane's `stream_id` is spliced into the encoded object. Only the events that
carry the response object (`response.created`, `response.completed`, ...), finished output items
and errors are re-encoded: the first to echo the client's `previous_response_id`, the terminal
ones to advance the cache before the client hears the response finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from orjson import JSONDecodeError, loads

from .cache import decoded_size
from .logs import for_log
from .protocol import (
    DECODED_EVENTS,
    FAILURE_EVENTS,
    RESPONSE_EVENTS,
    SUCCESS_EVENTS,
    TERMINAL_EVENT_BY_STATUS,
    server_error,
)
from .steering import CLIENT_CALLS, SteerInbox

__all__ = ["ResponseStream", "lifecycle_events"]

logger = logging.getLogger(__name__)


class ResponseStream:
    """Decorates and forwards the events of one response; remembers how it ended.

    `on_finished(response, output, size)` runs on a terminal success before that event is sent
    (`size`: the response object's decoded size, for the cache's accounting),
    `on_failed()` on a failure; `send_text` sends one frame (raising `ClientGone` when the
    client left).
    """

    __slots__ = (
        "_client_calls",
        "_output_items",
        "_prefix",
        "_sent",
        "_started",
        "ended",
        "failure",
        "finished",
        "inbox",
        "on_failed",
        "on_finished",
        "output",
        "previous_response_id",
        "response_id",
        "send_text",
        "steered",
        "stream_id",
        "succeeded",
    )

    def __init__(
        self,
        *,
        send_text: Callable[[str], Awaitable[None]],
        stream_id: str | None,
        previous_response_id: str | None,
        on_finished: Callable[[dict[str, Any], list[dict[str, Any]], int], None],
        on_failed: Callable[[], None],
        inbox: SteerInbox | None = None,
    ) -> None:
        self.send_text = send_text
        #: Steering input queued for this response (None: steering is off).
        self.inbox = inbox
        #: The response was ended at an output boundary for steering input.
        self.steered = False
        #: The finished response's output items (None until it finished well).
        self.output: list[dict[str, Any]] | None = None
        self._started: dict[str, Any] | None = None  # the response as `response.created` had it
        self._client_calls = False  # an item the client must answer is out: never cut
        self.stream_id = stream_id
        self.previous_response_id = previous_response_id
        self.on_finished = on_finished
        self.on_failed = on_failed
        self.finished = False
        #: Set when the response ended (`finished`), for whoever waits on it.
        self.ended = asyncio.Event()
        self.succeeded = False
        #: The error code the response failed with (`response_failed` when it had none).
        self.failure: str | None = None
        self.response_id: str | None = None
        self._output_items: dict[int, dict[str, Any]] = {}
        self._sent = 0  # events sent so far: the next one's sequence_number
        self._prefix = b'{"stream_id":"' + stream_id.encode() + b'",' if stream_id else None

    def frame(self, event_type: str | None, data: bytes) -> str | dict[str, Any] | None:
        """One event of the handler's SSE stream: the frame that forwards it as it was encoded
        (the lane spliced in, counted as sent); the event decoded when it must go through
        :meth:`handler_event` instead (it carries the response or an error); None when it is
        no JSON object.

        The data's own `type` decides (the `event:` line only stands in when it has none).
        Synchronous, so a chunk's events go out with no await but the sends themselves.
        """
        try:
            event = loads(data)
        except JSONDecodeError:
            return None
        if type(event) is not dict:
            return None
        kind = event.get("type", event_type)
        if kind.__class__ is str and kind in DECODED_EVENTS:
            if kind != "response.output_item.done" or (self.inbox is not None and self.inbox.cuts):
                event["type"] = kind
                return event
            self._remember_item(event)
        prefix = self._prefix
        if prefix is not None:
            data = data.strip()
            if data[1:2] == b'"':  # `{"key":...}`: splice the lane in after the brace
                data = prefix + data[1:]
            else:
                rest = data[1:].lstrip()
                data = prefix + rest if rest != b"}" else prefix[:-1] + b"}"
        self._sent += 1
        return data.decode()  # orjson accepted it, so it is valid UTF-8

    async def handler_event(self, event: dict[str, Any] | None) -> None:
        """Forward an event of the handler's stream that :meth:`frame` decoded (None: one that
        was no JSON object, answered with an error for the turn)."""
        if event is None:
            logger.warning("the handler sent an SSE event that is not a JSON object")
            event = server_error("The handler sent an event that is not a JSON object.")
            await self.event(event)
            return
        await self.event(event, from_handler=True)

    def next_sequence_number(self) -> int:
        """The sequence number for an event ws_mode sends about this response."""
        number = self._sent
        self._sent += 1
        return number

    async def sse_event(self, event_type: str | None, data: bytes) -> None:
        """Forward one event of the handler's SSE stream."""
        if self.finished:
            return
        framed = self.frame(event_type, data)
        if isinstance(framed, str):
            await self.send_text(framed)
        else:
            await self.handler_event(framed)

    async def event(self, event: dict[str, Any], *, from_handler: bool = False) -> None:
        """Forward an event given as an object, updating the stream's state from it.

        An error event ws_mode made (not `from_handler`) is numbered after the events sent
        before it.
        """
        if self.finished:
            return
        kind = event.get("type")
        response = None
        if kind in RESPONSE_EVENTS:
            response = event.get("response")
            if isinstance(response, dict):
                response["previous_response_id"] = self.previous_response_id
                if isinstance(response.get("id"), str):
                    self.response_id = response["id"]
                if self._started is None:
                    self._started = response
        elif kind == "error":
            event = _nested_error(event)
            if not from_handler or not isinstance(event.get("sequence_number"), int):
                event["sequence_number"] = self._sent
        elif kind == "response.output_item.done":
            self._remember_item(event)
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        text = orjson.dumps(event).decode()
        # The cache advances before the client hears the response finished, so it can
        # continue from it at once, on any lane.
        if kind in SUCCESS_EVENTS:
            self._succeed(response, decoded_size(text))
        elif kind in FAILURE_EVENTS:
            self._fail(_failure_code(event))
        self._sent += 1
        await self.send_text(text)
        if kind == "response.output_item.done" and self.inbox is not None and self.inbox.cuts:
            await self._cut()

    async def _cut(self) -> None:
        """End the response here for the steering input queued, unless an item the client
        must answer is out (steering never cancels tools)."""
        if self._client_calls or self._started is None or self.finished:
            return
        output = [self._output_items[index] for index in sorted(self._output_items)]
        response = {
            **self._started,
            "status": "incomplete",
            "incomplete_details": {"reason": "steered"},
            "output": output,
        }
        self.steered = True
        cut = {"type": "response.incomplete", "sequence_number": self._sent, "response": response}
        await self.event(cut)

    def _remember_item(self, event: dict[str, Any]) -> None:
        item, index = event.get("item"), event.get("output_index")
        if isinstance(item, dict):
            if item.get("type") in CLIENT_CALLS:
                self._client_calls = True
            self._output_items[index if isinstance(index, int) else len(self._output_items)] = item

    def _succeed(self, response: Any, size: int) -> None:
        self.finished = True
        self.ended.set()
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            logger.warning("a terminal event had no response id; the response is not cached")
            return
        output = response.get("output")
        if not isinstance(output, list) or (not output and self._output_items):
            # A terminal event may omit the output; the finished items hold it.
            output = [self._output_items[index] for index in sorted(self._output_items)]
        self.succeeded = True
        self.output = [item for item in output if isinstance(item, dict)]
        self.on_finished(response, self.output, size)

    def _fail(self, code: str) -> None:
        self.finished = True
        self.failure = code
        self.ended.set()
        self.on_failed()


def _nested_error(event: dict[str, Any]) -> dict[str, Any]:
    """An SSE `error` event (flat `code`/`message`/`param`) in the socket's nested envelope."""
    error = event.get("error")
    fields = error if isinstance(error, dict) else event
    kind = _text(fields.get("type") if fields is error else event.get("error_type"))
    status = event.get("status")
    kind = kind or "server_error"
    nested: dict[str, Any] = {
        "type": "error",
        "status": status if isinstance(status, int) else (400 if kind != "server_error" else 500),
        "error": {
            **(error if isinstance(error, dict) else {}),
            "type": kind,
            "code": _text(fields.get("code")) or kind,
            "message": _text(fields.get("message")) or "The handler reported an error.",
            "param": _text(fields.get("param")),
        },
    }
    if isinstance(event.get("sequence_number"), int):
        nested["sequence_number"] = event["sequence_number"]
    return nested


def _failure_code(event: dict[str, Any]) -> str:
    """The code of an `error` event (nested envelope) or of a failed response's error."""
    if event.get("type") == "error":
        error = event.get("error")
    else:
        response = event.get("response")
        error = response.get("error") if isinstance(response, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else "response_failed"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def lifecycle_events(
    response: dict[str, Any], *, in_progress: bool = True
) -> Iterable[dict[str, Any]]:
    """The events an SSE stream would have carried for a finished response object
    (`in_progress=False` leaves out `response.in_progress`, as a warm-up does)."""
    output: list[Any] = response.get("output") or []
    status = response.get("status") or "completed"
    terminal = TERMINAL_EVENT_BY_STATUS.get(status)
    if terminal is None:
        logger.warning("the handler answered with a response whose status is %s", for_log(status))
        yield server_error(
            f"The handler answered with a response whose status is {status!r}, not finished."
        )
        return
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    seq = _Counter()
    yield {"type": "response.created", "sequence_number": seq(), "response": started}
    if in_progress:
        yield {"type": "response.in_progress", "sequence_number": seq(), "response": started}
    for index, item in enumerate(output):
        if not isinstance(item, dict):
            continue
        yield from _item_events(index, item, seq)
    yield {"type": terminal, "sequence_number": seq(), "response": response}


class _Counter:
    def __init__(self) -> None:
        self.value = -1

    def __call__(self) -> int:
        self.value += 1
        return self.value


def _item_events(index: int, item: dict[str, Any], seq: _Counter) -> Iterable[dict[str, Any]]:
    kind = item.get("type")
    item_id = item.get("id")
    if kind == "message":
        started: dict[str, Any] = {**item, "status": "in_progress", "content": []}
    elif kind == "function_call":
        started = {**item, "status": "in_progress", "arguments": ""}
    else:
        started = item
    yield {
        "type": "response.output_item.added",
        "sequence_number": seq(),
        "output_index": index,
        "item": started,
    }
    if kind == "message":
        for part_index, part in enumerate(item.get("content") or []):
            if not isinstance(part, dict):
                continue
            where = {"item_id": item_id, "output_index": index, "content_index": part_index}
            text = part.get("text")
            empty = {**part, "text": ""} if isinstance(text, str) else part
            yield {
                "type": "response.content_part.added",
                "sequence_number": seq(),
                **where,
                "part": empty,
            }
            if part.get("type") == "output_text" and isinstance(text, str):
                delta = {"type": "response.output_text.delta", "delta": text, "logprobs": []}
                yield {**delta, "sequence_number": seq(), **where}
                done = {"type": "response.output_text.done", "text": text, "logprobs": []}
                yield {**done, "sequence_number": seq(), **where}
            yield {
                "type": "response.content_part.done",
                "sequence_number": seq(),
                **where,
                "part": part,
            }
    elif kind == "function_call":
        arguments = item.get("arguments") or ""
        where = {"item_id": item_id, "output_index": index}
        yield {
            "type": "response.function_call_arguments.delta",
            "sequence_number": seq(),
            **where,
            "delta": arguments,
        }
        yield {
            "type": "response.function_call_arguments.done",
            "sequence_number": seq(),
            **where,
            "arguments": arguments,
            "name": item.get("name"),
        }
    yield {
        "type": "response.output_item.done",
        "sequence_number": seq(),
        "output_index": index,
        "item": item,
    }
