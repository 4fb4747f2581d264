"""The agent's side of a rollout: what it sends each turn and what it makes of each answer.

:class:`Agent` reads each finished turn's response, records it in the :class:`RolloutResult`,
runs the tools the model asks for (:func:`tool_output`, deterministic) and hands back what to
send next; :meth:`Agent.drive` is the loop both drivers of :mod:`ws_mode.toolkit.rollout` run,
over HTTP or over the socket. :class:`RolloutError` says why a rollout cannot go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ws_mode import Usage

from .http_client import describe_error
from .measure import median

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_PATH",
    "DEFAULT_PROMPT",
    "DEFAULT_TOOLS",
    "Agent",
    "RolloutError",
    "RolloutResult",
    "TurnCallback",
    "check_arguments",
    "request_fields",
    "terminal_response",
    "tool_output",
    "user_message",
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
_FILLER: Final = " lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"

TurnCallback = Callable[[int, float], None]
"""Called after each turn with the turn's number (from 1) and its wall time in seconds."""


class RolloutError(Exception):
    """The rollout could not go on: the server answered an error, or could not be reached.
    ``status`` is the HTTP status the server refused with (a request or the socket's
    handshake), when it did."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
        outputs: each turn's output items, as its response object listed them.
        usages: each turn's token counts, as its response object reported them (cleaned as
            the middleware's metrics count them; None for a turn that reported none).
    """

    mode: Literal["http", "socket"]
    turn_seconds: list[float] = field(default_factory=list)
    turn_bytes: list[int] = field(default_factory=list)
    total_seconds: float = 0.0
    answer: str = ""
    tool_calls: int = 0
    response_ids: list[str] = field(default_factory=list)
    outputs: list[list[dict[str, Any]]] = field(default_factory=list)
    usages: list[Usage | None] = field(default_factory=list)

    @property
    def turns(self) -> int:
        """The number of model calls made."""
        return len(self.turn_seconds)

    @property
    def bytes_sent(self) -> int:
        """The bytes the client sent over the whole rollout."""
        return sum(self.turn_bytes)

    def cache_share(self, *, continuations: bool) -> float | None:
        """The share of the input tokens read from the server's prompt cache over the
        rollout's continuations (every turn but the first) or, with ``continuations`` False,
        its first turn (which has nothing to hit); None when those turns reported no input
        tokens."""
        usages = self.usages[1:] if continuations else self.usages[:1]
        reported = [usage for usage in usages if usage is not None]
        total = sum(usage.input_tokens for usage in reported)
        if total <= 0:
            return None
        return min(1.0, sum(usage.cached_tokens for usage in reported) / total)

    def early_median(self, count: int = 3) -> float:
        """The median wall time of the first ``count`` turns, in seconds."""
        return median(self.turn_seconds[:count], empty=0.0)

    def late_median(self, count: int = 3) -> float:
        """The median wall time of the last ``count`` turns, in seconds."""
        return median(self.turn_seconds[-count:] if count > 0 else [], empty=0.0)


def tool_output(call_id: str, size: int) -> str:
    """The deterministic output of the tool call ``call_id``: ``size`` ASCII characters (and as
    many bytes, JSON-encoded too: no character needs escaping)."""
    if size <= 0:
        return ""
    unit = f"[{call_id}]{_FILLER}"
    return (unit * (size // len(unit) + 1))[:size]


def user_message(prompt: str) -> dict[str, Any]:
    """The user message that starts a rollout."""
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": prompt}],
    }


def check_arguments(turns: int, tool_output_bytes: int) -> None:
    """ValueError unless ``turns`` is an int >= 1 and ``tool_output_bytes`` an int >= 0."""
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"turns must be an int >= 1, got {turns!r}")
    if isinstance(tool_output_bytes, bool) or not isinstance(tool_output_bytes, int):
        raise ValueError(f"tool_output_bytes must be an int, got {tool_output_bytes!r}")
    if tool_output_bytes < 0:
        raise ValueError(f"tool_output_bytes must be >= 0, got {tool_output_bytes}")


def request_fields(
    model: str,
    tools: Sequence[Mapping[str, Any]] | None,
    instructions: str | None,
    metadata: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The fields every turn sends. Instructions are not carried over from the previous
    response (docs/protocol.md, "Conversation state"), and clients re-send their tools, so both
    go on every turn."""
    fields: dict[str, Any] = {"model": model}
    if instructions is not None:
        fields["instructions"] = instructions
    if tools is not None:
        fields["tools"] = [dict(tool) for tool in tools]
    if metadata:
        fields["metadata"] = dict(metadata)
    return fields


class Agent:
    """The client side of the loop: reads each turn's output, runs the tools it asks for."""

    def __init__(
        self,
        result: RolloutResult,
        turns: int,
        tool_output_bytes: int,
        follow_ups: Sequence[str] | None = None,
    ) -> None:
        self.result = result
        self.turns = turns
        self.tool_output_bytes = tool_output_bytes
        #: With follow-ups, a conversation: each answer before the last turn gets the next
        #: user message (cycled), and the rollout ends after ``turns`` model calls.
        self.follow_ups = tuple(follow_ups) if follow_ups is not None else None
        self.answers = 0

    def step(self, response: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Record a finished turn; return the items to send next (the tool outputs, or in a
        conversation the next user message), or None when the rollout is over."""
        result = self.result
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id:
            raise RolloutError(f"turn {result.turns}: the response has no id")
        result.response_ids.append(response_id)
        output = response.get("output")
        if not isinstance(output, list):
            raise RolloutError(f"turn {result.turns}: the response has no output list")
        result.outputs.append(output)
        result.usages.append(Usage.of(response))
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
            self.answers += 1
            if self.follow_ups and result.turns < self.turns:
                prompt = self.follow_ups[(self.answers - 1) % len(self.follow_ups)]
                return [user_message(prompt)]
            return None
        if result.turns >= self.turns:
            if self.follow_ups is not None:
                return None  # a conversation ends after its turns, whatever the model asks
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

    def drive(
        self,
        exchange: Callable[[int], tuple[dict[str, Any], int, float]],
        advance: Callable[[dict[str, Any], list[dict[str, Any]]], None],
        on_turn: TurnCallback | None,
        started: float,
    ) -> None:
        """Run turns until the model answers: ``exchange(turn)`` sends one and returns its
        response, the bytes sent and its wall time; ``advance(response, outputs)`` makes the
        next turn's request. ``started`` is when the rollout began (``perf_counter``)."""
        result = self.result
        while True:
            turn = result.turns + 1
            response, size, elapsed = exchange(turn)
            result.turn_seconds.append(elapsed)
            result.turn_bytes.append(size)
            if on_turn is not None:
                on_turn(turn, elapsed)
            outputs = self.step(response)
            if outputs is None:
                # The rollout ends with the answer; closing the connection is not part of it.
                result.total_seconds = time.perf_counter() - started
                return
            advance(response, outputs)


def terminal_response(event: dict[str, Any], turn: int) -> dict[str, Any]:
    """The response object of a terminal event, or RolloutError when it is not a success."""
    kind = event.get("type")
    if kind == "error":
        raise RolloutError(f"turn {turn}: the server answered an error: {describe_error(event)}")
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
