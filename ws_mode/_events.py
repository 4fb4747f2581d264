"""A response's events on their way to the socket, and the events of a finished response.

Every event is checked to be a JSON object (a handler that sends anything else gets an error
event for its turn), but most go out as the handler encoded them: the data's own `type` names
it (read by the `ResponseTap`, which stateful HTTP shares), and a lane's `stream_id` is spliced
into the encoded object. Only errors, the events that carry the response object
(`response.created`, `response.completed`, ...) when the echo of the client's
`previous_response_id` changes them, and a finished output item the response may be cut after
for steering are re-encoded. The tap reads the events that carry the response either way, and
a terminal one tells the turn (the stream's `ResponseOwner`) how the response ended before it
goes out, so the cache advances before the client hears it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson
from orjson import JSONEncodeError, dumps

from ._cache import decoded_size
from ._logs import for_log
from ._protocol import (
    DECODED_EVENTS,
    RESPONSE_EVENTS,
    TERMINAL_EVENT_BY_STATUS,
    memory_budget_exceeded,
    server_error,
)
from ._socket import ClientSocket
from ._steering import SteerInbox
from ._tap import ResponseTap

logger = logging.getLogger(__name__)


class ResponseOwner(Protocol):
    """The turn a response belongs to (`ws_mode._turn_runner`), told how the response ended
    before its terminal event is sent, so the client can continue from it at once, on any
    lane."""

    def response_finished(
        self, response: dict[str, Any], output: list[dict[str, Any]], size: int
    ) -> None:
        """The response finished well; `size` is the response object's decoded size."""

    def response_failed(self, response: dict[str, Any] | None) -> None:
        """The response failed; `response` is its terminal response object (that of
        `response.failed`; None for an `error` event, which carries none)."""


class ResponseStream:
    """Decorates and forwards the events of one response to the client's socket; remembers
    how it ended (its `tap`) and tells its `owner`.

    Events come in two ways. :meth:`frame` takes an event of the handler's SSE stream,
    synchronously: most come back as the frame that forwards them as they are, which the
    caller sends on `send_text` (the hot path: no await but the send itself); those that carry
    the response or an error come back decoded, for :meth:`event`. :meth:`event` takes an event
    as an object: one `frame` decoded (`from_handler`), or one ws_mode made (an error, the
    lifecycle events of a JSON answer).
    """

    __slots__ = (
        "_last",
        "_prefix",
        "_refused",
        "_sent",
        "_shift",
        "bytes_out",
        "ended",
        "finished",
        "inbox",
        "interruption",
        "owner",
        "send_text",
        "steered",
        "stream_id",
        "tap",
    )

    def __init__(
        self,
        socket: ClientSocket,
        owner: ResponseOwner,
        *,
        stream_id: str | None,
        previous_response_id: str | None,
        inbox: SteerInbox | None = None,
    ) -> None:
        #: Sends one frame on the socket (raising `ClientGone` when the client left).
        self.send_text: Callable[[str], Awaitable[None]] = socket.send_text
        self.owner = owner
        #: Steering input queued for this response (None: steering is off).
        self.inbox = inbox
        #: The response was ended at an output boundary for steering input.
        self.steered = False
        #: The frames that end the response for the client's `response.interrupt`, once it
        #: was interrupted (`interrupt`), to be sent by its turn: the acceptance first.
        self.interruption: list[str] | None = None
        self.tap = ResponseTap(previous_response_id)
        self.stream_id = stream_id
        self.finished = False
        #: Resolved when the response ended (`finished`): the future the turn waits on (set by
        #: the turn runner; None while nobody waits).
        self.ended: asyncio.Future[None] | None = None
        #: The handler's last event sent, as its `sequence_number` says: the event decoded or
        #: encoded (the hot path keeps it as it was, read only when ws_mode adds an event), or
        #: the number (None: none yet).
        self._last: dict[str, Any] | bytes | int | None = None
        #: One more than the last `sequence_number` ws_mode gave an event of its own.
        self._sent = 0
        #: What the handler's numbers are moved up by, once ws_mode added events among them,
        #: so that one numbering goes on (0 until then: the hot path forwards them as they are).
        self._shift = 0
        self._refused = False  # ended by `refuse`: its owner is not told it failed
        #: The length of the frames sent so far (for the access log and the turn's span).
        self.bytes_out = 0
        self._prefix = b'{"stream_id":"' + stream_id.encode() + b'",' if stream_id else None

    @property
    def succeeded(self) -> bool:
        """The response finished well."""
        return self.tap.succeeded

    @property
    def failure(self) -> str | None:
        """The error code the response failed with (`response_failed` when it had none)."""
        return self.tap.failure

    @property
    def output(self) -> list[dict[str, Any]] | None:
        """The finished response's output items (None until it finished well)."""
        return self.tap.output

    @property
    def response_id(self) -> str | None:
        """The response's id, once an event carried it."""
        return self.tap.response_id

    def frame(self, event_type: str | None, data: bytes) -> str | dict[str, Any]:
        """One event of the handler's SSE stream: the frame that forwards it as it was encoded
        (the lane spliced in, its `sequence_number` counted as sent), or the event decoded when
        it must go through :meth:`event` instead (it carries the response or an error, or its
        `sequence_number` moves up after an event ws_mode added; an error event for the turn
        when the data is no JSON object).

        The tap decodes it (the data's own `type` decides). Synchronous, so a chunk's events
        go out with no await but the sends themselves.
        """
        event = self.tap.decode(event_type, data)
        if event is None:
            logger.warning("the handler sent an SSE event that is not a JSON object")
            return _not_a_json_object()
        if self._shift and type(event.get("sequence_number")) is int:
            return event  # ws_mode added events: `event` numbers it after them
        kind = event.get("type")
        if kind.__class__ is str and kind in DECODED_EVENTS:
            tap = self.tap
            if kind == "response.output_item.done":
                if self.inbox is not None and self.inbox.cuts:
                    return event  # the response may end after it: `event` asks the inbox
                tap.remember_item(event)
            elif kind == "response.output_item.added":
                tap.item_added(event)  # open until its `done`: an interrupt names it
            elif kind in RESPONSE_EVENTS and tap.echo_unchanged(event):
                # Its response object already says the client's `previous_response_id`: no
                # re-encoding, it goes out as it was encoded (the tap reads it all the same).
                tap.see(event)
                if tap.finished:
                    self._ended(data)
            else:
                return event  # an error, or the echo changes it
        self._last = event
        if self._prefix is None:  # the default lane: the data is the frame (`_forwarded`)
            self.bytes_out += len(data)
            return data.decode()  # orjson accepted it, so it is valid UTF-8
        return self._forwarded(data)

    def frame_object(self, event: dict[str, Any] | bytes) -> str | dict[str, Any]:
        """One event the handler handed as an object (`Turn.send_event`), or as its JSON
        encoded already: like :meth:`frame`, without the SSE text. An object is encoded once,
        here, and only the events :meth:`event` takes are decoded again (a copy: the stream
        never keeps the handler's objects)."""
        if isinstance(event, bytes):
            return self.frame(None, event)
        try:
            data = dumps(event)
        except JSONEncodeError:
            data = b""
        if type(event) is not dict or not data:
            logger.warning("the handler handed an event that is not a JSON object")
            return _not_a_json_object()
        kind = event.get("type")
        if kind.__class__ is str and kind in DECODED_EVENTS:
            return self.frame(None, data)
        if self._shift and type(event.get("sequence_number")) is int:
            return self.frame(None, data)  # decoded again, for `event` to renumber
        self._last = data  # not the handler's object, which it may change
        if self._prefix is None:  # the default lane: the encoding is the frame
            self.bytes_out += len(data)
            return data.decode()
        return self._forwarded(data)

    def _forwarded(self, data: bytes) -> str:
        """The frame of an event's encoded JSON object: the lane spliced in."""
        prefix = self._prefix
        if prefix is not None:
            data = data.strip()
            if data[1:2] == b'"':  # `{"key":...}`: splice the lane in after the brace
                data = prefix + data[1:]
            else:
                rest = data[1:].lstrip()
                data = prefix + rest if rest != b"}" else prefix[:-1] + b"}"
        self.bytes_out += len(data)
        return data.decode()  # orjson accepted it, so it is valid UTF-8

    def next_sequence_number(self) -> int:
        """The sequence number for an event ws_mode adds to this response: the next after the
        last one sent. The handler's later events are numbered after it (its numbers moved up
        from here on), so the client sees one numbering, strictly increasing."""
        last = self._handler_number()
        number = max(self._sent, last + self._shift + 1)
        self._sent = number + 1
        # The handler's next event (its last number plus one) goes out after this one.
        self._shift = number - last
        return number

    def _handler_number(self) -> int:
        """The handler's own `sequence_number` of its last event sent (-1: none numbered)."""
        last = self._last
        if isinstance(last, bytes):
            last = orjson.loads(last)  # it was sent: it is a JSON object
        if isinstance(last, dict):
            last = last.get("sequence_number")
        return last if type(last) is int else -1

    async def event(
        self, event: dict[str, Any], *, from_handler: bool = False, own: bool = False
    ) -> None:
        """Forward an event given as an object, updating the stream's state from it.

        One numbering for everything the client receives about the response: the response's
        own events (the handler's, `from_handler`, and those ws_mode makes of a JSON answer)
        keep their `sequence_number`, moved up once ws_mode added events among them (`own`:
        one numbered already by `next_sequence_number`). An error keeps its own only when it
        comes `from_handler` with one; others are numbered after the last event sent.
        """
        if self.finished:
            return
        kind = event.get("type")
        if kind == "error":
            event = _nested_error(event)
        number = event.get("sequence_number")
        if own:
            pass  # numbered by `next_sequence_number`
        elif kind == "error" and (not from_handler or type(number) is not int):
            event["sequence_number"] = self.next_sequence_number()
        elif type(number) is int:  # the response's own, the handler's or of its JSON answer
            self._last = number
            if self._shift:
                event["sequence_number"] = number + self._shift
        tap = self.tap
        tap.see(event)
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        encoded = orjson.dumps(event)
        self.bytes_out += len(encoded)
        text = encoded.decode()
        del encoded  # not held while the frame goes out
        if tap.finished:
            self._ended(text)
        await self.send_text(text)
        if kind == "response.output_item.done" and self.inbox is not None:
            # A safe boundary: the response ends here when steering input waits for it.
            cut = self.inbox.cut(tap, self.next_sequence_number)
            if cut is not None:
                self.steered = True
                await self.event(cut, own=True)

    async def refuse(self, what: str) -> None:
        """End the response with `server_is_overloaded` (503): the process's memory budget
        cannot hold `what` (the handler's answer). Like the budget's other refusals it leaves
        the conversation as it was: the owner is not told the response failed, so the response
        the client continued from stays cached, even on its own lane."""
        self._refused = True
        await self.event(memory_budget_exceeded(what, self.stream_id))

    def interrupt(self) -> None:
        """End the response now, for the client's `response.interrupt`: what the handler still
        sends is dropped from here on, the response is cached as it stands, and `interruption`
        holds the frames that tell the client, numbered after what was sent:
        `response.interrupt.accepted`, `response.output_item.interrupted` for each item still
        open, and the terminal `response.incomplete` (`incomplete_details.reason:
        "interrupted"`, the finished items as `output`, the latest usage the handler reported).
        Synchronous, so no event of the handler's can come between (the turn sends them)."""
        tap = self.tap
        started = tap.started
        # A running response, with an id.
        assert started is not None
        assert not self.finished
        response_id = tap.response_id
        events: list[dict[str, Any]] = [
            {
                "type": "response.interrupt.accepted",
                "sequence_number": self.next_sequence_number(),
                "response_id": response_id,
            }
        ]
        for index, item_id in tap.open_items():
            events.append(
                {
                    "type": "response.output_item.interrupted",
                    "sequence_number": self.next_sequence_number(),
                    "response_id": response_id,
                    "item_id": item_id,
                    "output_index": index,
                }
            )
        response = {
            **started,
            "status": "incomplete",
            "incomplete_details": {"reason": "interrupted"},
            "output": tap.items_so_far(),
            "usage": tap.usage,
        }
        terminal = {
            "type": "response.incomplete",
            "sequence_number": self.next_sequence_number(),
            "response": response,
        }
        events.append(terminal)
        tap.see(terminal)
        frames = []
        for event in events:
            if self.stream_id is not None:
                event["stream_id"] = self.stream_id
            frames.append(orjson.dumps(event).decode())
        self.bytes_out += sum(len(frame) for frame in frames)
        self.interruption = frames
        self._ended(frames[-1])

    def _ended(self, encoded: str | bytes) -> None:
        """The event about to go out (`encoded`) ended the response: the stream is finished
        and its owner told how. The cache advances before the client hears the response
        finished, so it can continue from it at once, on any lane."""
        tap = self.tap
        self.finished = True
        ended = self.ended
        if ended is not None and not ended.done():
            ended.set_result(None)
        if tap.response is not None and tap.output is not None:
            self.owner.response_finished(tap.response, tap.output, decoded_size(encoded))
        elif tap.failure is not None and not self._refused:
            self.owner.response_failed(tap.terminal)


def _not_a_json_object() -> dict[str, Any]:
    """The error event for the turn whose handler sent an event that is no JSON object; it
    has no `sequence_number` of its own, so it is numbered as it is sent."""
    event = server_error("The handler sent an event that is not a JSON object.")
    del event["sequence_number"]
    return event


def _nested_error(event: dict[str, Any]) -> dict[str, Any]:
    """An SSE `error` event (flat `code`/`message`/`param`) in the socket's nested envelope;
    its `error.headers` (rate limits, when to retry) also beside `error`."""
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
    headers = nested["error"].get("headers")
    if isinstance(headers, dict) and headers:
        # OpenAI's schema and its SDKs read `error.headers`; Codex reads `headers` beside
        # `error`: both carry them.
        nested["headers"] = headers
    return nested


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
    """The events an SSE stream carries for one finished output item: added, the events of
    its content (text, refusal, arguments, a custom tool's input, reasoning, compaction),
    done; each as the SDKs' server-event union types it."""
    kind = item.get("type")
    item_id = item.get("id")
    if kind == "message":
        started: dict[str, Any] = {**item, "status": "in_progress", "content": []}
    elif kind == "function_call":
        started = {**item, "status": "in_progress", "arguments": ""}
    elif kind == "custom_tool_call":
        started = {**item, "input": ""}
    elif kind == "reasoning":
        started = {**item, "summary": [], **({"content": []} if "content" in item else {})}
    else:
        started = item
    yield {
        "type": "response.output_item.added",
        "sequence_number": seq(),
        "output_index": index,
        "item": started,
    }
    where = {"item_id": item_id, "output_index": index}
    if kind == "message":
        for part_index, part in enumerate(item.get("content") or []):
            if isinstance(part, dict):
                yield from _part_events({**where, "content_index": part_index}, part, seq)
    elif kind == "function_call":
        arguments = item.get("arguments") or ""
        yield _delta("response.function_call_arguments.delta", where, arguments, seq)
        done = {"type": "response.function_call_arguments.done", "sequence_number": seq()}
        done.update(where, arguments=arguments)
        name = item.get("name")
        if isinstance(name, str):
            # Not in the SDKs' model of the event; OpenAI's API reference shows it.
            done["name"] = name
        yield done
    elif kind == "custom_tool_call":
        text = item.get("input") or ""
        yield _delta("response.custom_tool_call_input.delta", where, text, seq)
        done = {"type": "response.custom_tool_call_input.done", "sequence_number": seq()}
        yield {**done, **where, "input": text}
    elif kind == "reasoning":
        yield from _reasoning_events(where, item, seq)
    elif kind == "compaction":
        yield {"type": "response.compaction.compacting", "sequence_number": seq(), **where}
    yield {
        "type": "response.output_item.done",
        "sequence_number": seq(),
        "output_index": index,
        "item": item,
    }


def _delta(kind: str, where: dict[str, Any], delta: str, seq: _Counter) -> dict[str, Any]:
    return {"type": kind, "sequence_number": seq(), **where, "delta": delta}


def _part_events(
    where: dict[str, Any], part: dict[str, Any], seq: _Counter
) -> Iterable[dict[str, Any]]:
    """A message content part's events: added (its text empty), its text or refusal as one
    delta and done, then done."""
    kind = part.get("type")
    field = "refusal" if kind == "refusal" else "text"
    text = part.get(field)
    empty = {**part, field: ""} if isinstance(text, str) else part
    yield {"type": "response.content_part.added", "sequence_number": seq(), **where, "part": empty}
    if kind == "output_text" and isinstance(text, str):
        yield {**_delta("response.output_text.delta", where, text, seq), "logprobs": []}
        done = {"type": "response.output_text.done", "text": text, "logprobs": []}
        yield {**done, "sequence_number": seq(), **where}
    elif kind == "refusal" and isinstance(text, str):
        yield _delta("response.refusal.delta", where, text, seq)
        yield {"type": "response.refusal.done", "sequence_number": seq(), **where, "refusal": text}
    yield {"type": "response.content_part.done", "sequence_number": seq(), **where, "part": part}


def _reasoning_events(
    where: dict[str, Any], item: dict[str, Any], seq: _Counter
) -> Iterable[dict[str, Any]]:
    """A reasoning item's summary parts (added, text delta and done, done) and its reasoning
    text parts (delta and done)."""
    for summary_index, part in enumerate(item.get("summary") or []):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            continue
        at = {**where, "summary_index": summary_index}
        text = part["text"]
        added = {"type": "response.reasoning_summary_part.added", "sequence_number": seq()}
        yield {**added, **at, "part": {**part, "text": ""}}
        yield _delta("response.reasoning_summary_text.delta", at, text, seq)
        done = {"type": "response.reasoning_summary_text.done", "sequence_number": seq()}
        yield {**done, **at, "text": text}
        part_done = {"type": "response.reasoning_summary_part.done", "sequence_number": seq()}
        yield {**part_done, **at, "part": part}
    for content_index, part in enumerate(item.get("content") or []):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            continue
        at = {**where, "content_index": content_index}
        yield _delta("response.reasoning_text.delta", at, part["text"], seq)
        done = {"type": "response.reasoning_text.done", "sequence_number": seq()}
        yield {**done, **at, "text": part["text"]}
