"""The Turn a handler sees, and the HTTP request body each turn sends it."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from ._budget import BODY_COPIES
from ._cache import VALUE_OVERHEAD, CachedResponse, decoded_size
from ._client_events import CreateEvent
from ._items import ADDITIONAL_TOOLS, Items, declared_tools, with_input
from ._steering import SteerInbox
from ._tap import Usage
from ._tokens import Tokens

SCOPE_KEY = "ws_mode"


class Turn:
    """One WebSocket mode turn, as the handler sees it.

    `previous` is the cached parent this turn continues (None for a fresh chain);
    `new_input` the items the client sent this turn; `history()` the whole context;
    `artifacts` a dict the handler fills, kept on this turn's cached response so the next
    turn finds it on `previous.artifacts`; `stream_id` the lane; `tools()` the tools it may
    call; `tools_changed` whether they differ from the parent's (always True for a fresh
    chain); `tool_artifacts` a dict the handler fills for these exact tools (rendered schemas,
    a namespace), handed back on every turn of the connection with the same tools. The tools
    are the request's `tools` and those the context's `additional_tools` items declare (how
    Codex sends them for Responses Lite models).

    `cache_aware` tells whether continuations may reach the handler with only their new input
    (`full_context="on_miss"`): only then is anything read back from `artifacts`, so a handler
    serving both ways saves them only when it is True.

    `claim_steering()` and `take_steering()` let a handler take `response.steer` input itself,
    mid-generation; otherwise the middleware ends the response at its next output item and
    continues in a successor turn.

    With a `renderer`, `prefix_tokens` holds the rendered context before this turn (never
    re-rendered) and `new_tokens` this turn's new input, rendered once.

    `usage` is what this turn's response used, read from its terminal response object as the
    metrics count it (`Usage.of`), once the response ended: what an `on_response` hook bills.
    `conversation_key` is the key of the conversation this turn belongs to (the same for every
    turn of one chain of responses, on any lane, connection or process sharing the secret;
    opaque hex, naming no response and no principal): what the request's `x-session-id`
    header (`conversation_key_headers`) carries too, for a router.
    """

    __slots__ = (
        "_hand_event",
        "_new_input",
        "_tools",
        "artifacts",
        "cache_aware",
        "conversation_key",
        "full_context",
        "generate",
        "new_tokens",
        "prefix_tokens",
        "previous",
        "previous_response_id",
        "principal",
        "steering",
        "stream_id",
        "tool_artifacts",
        "tools_changed",
        "tools_digest",
        "usage",
    )

    def __init__(
        self,
        *,
        previous: CachedResponse | None,
        new_input: list[dict[str, Any]] | Items,
        stream_id: str | None = None,
        tools_digest: bytes | None = None,
        generate: bool = True,
        full_context: bool = True,
        cache_aware: bool = False,
        tool_artifacts: dict[str, Any] | None = None,
        new_tokens: list[int] | None = None,
        principal: Any = None,
        steering: SteerInbox | None = None,
        tools: list[dict[str, Any]] | None = None,
        conversation_key: str | None = None,
    ) -> None:
        self.previous = previous
        self._tools = tools
        self._new_input = new_input if isinstance(new_input, Items) else Items(new_input)
        self.stream_id = stream_id
        self.tools_digest = tools_digest
        self.tools_changed = previous is None or previous.tools_digest != tools_digest
        self.previous_response_id = previous.id if previous is not None else None
        self.generate = generate
        #: Whether the handler's request body carries the whole context in `input`.
        self.full_context = full_context
        #: Whether continuations may come with only their new input (`full_context="on_miss"`).
        self.cache_aware = cache_aware
        self.artifacts: dict[str, Any] = {}
        self.tool_artifacts: dict[str, Any] = tool_artifacts if tool_artifacts is not None else {}
        self.new_tokens = new_tokens
        #: What the middleware's `authenticate` hook returned for this connection.
        self.principal = principal
        #: The conversation's key (`ws_mode._conversation`); None only for a Turn made by hand.
        self.conversation_key = conversation_key
        self.prefix_tokens: Tokens | None = None
        #: The tokens this turn's response used, as the metrics count them; None until it
        #: ended (set before `on_response` runs), and when it reported no usage.
        self.usage: Usage | None = None
        #: The steering input queued for this turn's response (None: steering is off).
        self.steering = steering
        #: Where `send_event` hands events while the handler call runs (None otherwise).
        self._hand_event: Callable[[dict[str, Any] | bytes], Awaitable[None]] | None = None
        if new_tokens is not None:
            prefix = previous.tokens if previous is not None else None
            self.prefix_tokens = prefix if prefix is not None else Tokens()

    def __repr__(self) -> str:
        return (
            f"<Turn previous={self.previous_response_id!r} new_input={len(self.new_input)} "
            f"stream_id={self.stream_id!r}>"
        )

    @property
    def new_input(self) -> list[dict[str, Any]]:
        """The items the client sent this turn."""
        return self._new_input.list

    def history(self) -> list[dict[str, Any]]:
        """The whole context: the parent chain's input and output items, then `new_input`."""
        if self.previous is None:
            return list(self.new_input)
        items = list(self.previous.context_items())
        items.extend(self.new_input)
        return items

    def tools(self) -> list[dict[str, Any]]:
        """The tool definitions this turn may call: the request's `tools`, then the `tools` of
        each `additional_tools` item of the context, in order. Reads the whole history when
        the context declares tools that way."""
        tools = list(self._tools or ())
        previous = self.previous
        if previous is not None and previous.declared_tools is not None:
            items: list[dict[str, Any]] = self.history()
        else:
            items = self.new_input
        for item in items:
            declared = item.get("tools") if item.get("type") == ADDITIONAL_TOOLS else None
            if isinstance(declared, list):
                tools.extend(declared)
        return tools

    def claim_steering(self) -> bool:
        """Take this turn's steering input yourself (with :meth:`take_steering`) instead of
        having the middleware end the response at its next output item and start a successor.
        False when steering is switched off."""
        if self.steering is None:
            return False
        self.steering.claim()
        return True

    def take_steering(self) -> list[dict[str, Any]]:
        """The user messages clients steered into this response since the last call, in the
        order they were sent (empty when there are none). What you take is applied: apply it
        in this response."""
        if self.steering is None:
            return []
        return [item for steer in self.steering.take() for item in steer.items]

    def send_event(self, event: dict[str, Any] | bytes) -> Awaitable[None]:
        """Hand one event of this turn's response to the client as an object (or as its JSON
        object, encoded already), instead of writing it to the SSE stream you answer with:
        no SSE text is written and decoded again, and an object is encoded once. Events
        handed here and those your answer's SSE carries go out in the order they came.

        Handed before your answer starts, the first event stands for a ``200
        text/event-stream`` answer; what your answer sends after the response's terminal
        event reaches nobody, so an empty one will do. Raises RuntimeError when no handler
        call of this turn is running, or after an answer that is not an event stream."""
        hand = self._hand_event
        if hand is None:
            raise RuntimeError("Turn.send_event() works only while the turn's handler runs.")
        return hand(event)  # the handler call's own coroutine: no second one per event

    def bind_events(self, hand: Callable[[dict[str, Any] | bytes], Awaitable[None]] | None) -> None:
        """Where `send_event` hands events (the running handler call), or None when none runs;
        ws_mode's, not the handler's."""
        self._hand_event = hand

    def tokens(self) -> list[int] | None:
        """The rendered tokens of the whole context (prefix then new input), or None without
        a renderer."""
        if self.prefix_tokens is None or self.new_tokens is None:
            return None
        return [*self.prefix_tokens.tolist(), *self.new_tokens]


def turn(request_or_scope: Any) -> Turn | None:
    """The Turn of a handler call made by ws_mode, or None for a plain HTTP request.

    Accepts a Starlette (or FastAPI) request, a Django request, or an ASGI scope.
    """
    scope = request_or_scope
    if not isinstance(scope, Mapping):
        scope = getattr(request_or_scope, "scope", None)
        if not isinstance(scope, Mapping):
            raise TypeError(
                "turn() takes a Starlette or Django request or an ASGI scope, "
                f"got {type(request_or_scope).__name__}."
            )
    return turn_of(scope)


def turn_of(scope: Mapping[str, Any]) -> Turn | None:
    """The Turn in an ASGI scope's extensions, or None."""
    extensions = scope.get("extensions") or {}
    found = extensions.get(SCOPE_KEY)
    return found if isinstance(found, Turn) else None


def tools_digest(tools: list[dict[str, Any]] | None, declared: bytes | None = None) -> bytes | None:
    """A digest of the tool definitions, equal for equal tools whatever the key order; with
    `declared` (`ws_mode._items.declared_tools`: the context's `additional_tools` items) it
    covers those too."""
    if not tools and declared is None:
        return None
    encoded = orjson.dumps(tools or [], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(encoded + (declared or b""), digest_size=16).digest()


def turn_tools_digest(create: CreateEvent, previous: CachedResponse | None) -> bytes | None:
    """The `tools_digest` of a turn: its request's `tools` and the tools its context's
    `additional_tools` items declare (the parent's, and those of its new input)."""
    items = create.items
    before = previous.declared_tools if previous is not None else None
    return tools_digest(create.tools, declared_tools(before, items.fragment, lambda: items.list))


def build_body(
    create: CreateEvent,
    previous: CachedResponse | None,
    *,
    full_context: bool,
    new_fragment: bytes | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """The HTTP request body of one turn.

    Fresh chains (and uncached parents forwarded to the handler) carry the client's fields
    and input as sent. Continuations either carry the whole
    context, assembled by joining the cached nodes' encoded fragments with the new items
    (`full_context`), or only the new items and `previous_response_id`. `extra` fields
    (`prompt_cache_key`, `cache_salt` from the conversation key) replace the client's.
    """
    if new_fragment is None:
        new_fragment = create.items.fragment  # encoded once, wherever it is needed
    if previous is None or not full_context:
        fields = dict(create.fields)
        if extra:
            fields.update(extra)
        if previous is not None:
            fields["previous_response_id"] = previous.id
        elif create.previous_response_id is not None:
            # An uncached parent forwarded to a handler that stores responses itself.
            fields["previous_response_id"] = create.previous_response_id
        if create.input_text is not None:
            fields["input"] = create.input_text
        elif create.input_sent or previous is not None:
            # The items are encoded already: join them in rather than encode them again.
            return with_input(orjson.dumps(fields), [new_fragment] if new_fragment else [])
        return orjson.dumps(fields)
    fragments = previous.context_fragments()
    if new_fragment:
        fragments.append(new_fragment)
    head = {**create.fields, **extra} if extra else create.fields
    return with_input(orjson.dumps(head), fragments)


def body_cost(
    body: bytes,
    previous: CachedResponse | None = None,
    *,
    full_context: bool = False,
    new_items: Items | None = None,
) -> int:
    """What a handler call holds of its request body while it runs (reserved in the memory
    budget from the build until the call ends): the body as bytes `BODY_COPIES` times (ws_mode's,
    a framework's copy), and decoded (`await request.json()`), estimated as the cache estimates
    items (`decoded_size`). Measured with a Starlette handler holding `await request.json()`:
    tiny items held 10.9 times the body (13.7 estimated), 100-character messages 5.4 times
    (5.6 estimated).

    Only the fields are scanned: a full-context body's history is counted from its cached
    nodes (`CachedResponse.context_decoded`), and the new items (`new_items`, the create's) by
    the helper process that parsed a large frame (`Items.decoded_estimate`), else here."""
    history = previous if previous is not None and full_context else None
    new = new_items.fragment if new_items is not None else b""
    # The layout `build_body` and `with_input` give: the fields, the history, the new items
    # (a string input is among the fields, about as long as its one item), then `]}`.
    head = len(body) - len(new) - 2 - (history.context_bytes if history is not None else 0)
    head = max(0, head)
    separators = body.count(b",", 0, head) + body.count(b":", 0, head)
    decoded = head + VALUE_OVERHEAD * (separators + 1)
    if history is not None:
        decoded += history.context_decoded
    if new_items is not None:
        estimate = new_items.decoded_estimate
        decoded += estimate if estimate is not None else decoded_size(new)
    return BODY_COPIES * len(body) + decoded
