"""The bounds a WebSocket mode connection works within."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ._errors import ConfigError

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Every bound the middleware enforces, with OpenAI's numbers as defaults.

    `max_connections` counts open sockets per middleware instance (one worker process), and
    `max_connections_per_client` those of one principal (what `authenticate` returned) or, with
    no hook, of one client address (None: no bound);
    `max_connection_seconds` ends a socket after that long (OpenAI: 60 minutes);
    `max_message_bytes` bounds one client frame; `max_cached_responses` and `max_cached_bytes`
    bound each connection's response cache; `max_in_flight` responses run at once per
    connection (the rest queue, at most `max_queued` of them holding at most
    `max_queued_bytes` of frames; one request may always wait); `max_streams` distinct named
    `stream_id`s per connection; `max_turn_seconds` bounds one handler call (None: no bound);
    a client that leaves a frame unread for `max_send_stall_seconds` is disconnected; a
    connection with no client frame and no turn running for `max_idle_seconds` is closed
    (None: never), which also frees what a vanished peer held;
    `shutdown_grace_seconds` is how long running turns may finish when the server drains;
    `max_pending_steers` `response.steer` submissions may wait for one response, and
    `max_steer_bytes` bounds all the steering input a connection holds waiting (in responses
    and behind responses that wait for tool output), counted at its decoded size as the cache
    counts items;
    `max_memory_bytes` is the process-wide budget of everything WebSocket mode holds (sockets,
    frames being parsed, queued creates, pending steering input, cached responses, the request
    bodies handlers hold, the handlers' answers read whole; every
    middleware of the process counts against one account): work that does not fit is refused
    (`server_is_overloaded`, 503) and, while it is exhausted, new sockets too (503).
    With a store (`store=`): `max_stored_bytes_per_principal` bounds the bytes one principal
    keeps in it (past it, that principal's least recently written conversations are dropped;
    a single conversation larger than the bound is not stored; None: no bound), and a
    continuation whose parent is not stored yet waits up to `store_wait_seconds` for its
    write to land (a response finished on another worker a moment ago); one hydration
    (beside that wait), or one stateful HTTP `GET` or `DELETE`, may take at most
    `store_read_seconds` and one write at most `store_write_seconds`, whatever the store's
    own timeouts (a write's `RedisStore` marker expires with it, and a drain waits that long
    for the writes under way).
    `after_response_grace_seconds` is how long post-response work (`on_response`, a handler
    still running after its terminal event) may run on once its connection closed;
    `abandon_handler_seconds` is how long a handler call ws_mode cancelled (an interrupt,
    steering, `max_turn_seconds`, the client leaving, a drain, the grace above run out) may
    take to end: the client has its terminal event and the lane goes on at once, and a call
    still running past it is abandoned (ws_mode stops waiting for it, lets go of what it held,
    drops what it still sends; counted in `handlers_abandoned`, logged once), so a handler
    that swallows `CancelledError` never holds a connection, the memory budget or a shutdown;
    `close_timeout_seconds` bounds sending the close frame (and how long a drain waits for
    its 503 answers to the upgrades not yet accepted); `max_buffered_answer_bytes`
    bounds an error or JSON answer of the handler, which is read whole, and one event of a
    streamed answer (the stream's length is not bounded).

    Fixed bounds: the other bounds are module constants, each a measured cost, a protocol
    fact, a process-wide detail or a ceiling over a knob set elsewhere (docs/limits.md,
    "Fixed bounds", says why for each): `_budget.BODY_COPIES`, `_budget.CONNECTION_COST`,
    `_budget.PARSE_FACTOR`, `_budget.ANSWER_FRAME_COPIES`, `_budget.MESSAGE_COPIES`,
    `_budget.INFLATE_STEP`,
    `_budget.PRESSURE_SHARE`, `_cache.TOO_LARGE_REMEMBERED`, `_cache.NODE_OVERHEAD`,
    `_cache.VALUE_OVERHEAD`, `_frames.OFF_LOOP_BYTES`, `_frames.WORKERS`, `_frames.MAX_FAILURES`,
    `_frames.RETRY_SECONDS`, `_hooks.HOOK_THREADS`, `_logs.LOG_VALUE_CHARS`,
    `_persistence.POLL_SECONDS`, `_persistence.POLL_MAX_SECONDS`, `_persistence.STORED_REMEMBERED`,
    `_protocol.MAX_ID_CHARS`, `_protocol.QUOTED_ID_CHARS`, `_protocol.STREAM_ID`,
    `redis_store.UNREADABLE_REMEMBERED`, `_stateful_http.ANSWER_PIECE`,
    `_stats.ERROR_CODE_LABELS`, `_stats.MODEL_LABELS`, `_steering.MAX_WAITING_RESPONSES`,
    `_tracing.FLUSH_SECONDS`, `_turn_runner.TOOL_SETS`,
    `proxy._transport._MAX_HEADER`.
    """

    max_connections: int = 1000
    max_connections_per_client: int | None = None
    max_connection_seconds: float = 3600.0
    max_message_bytes: int = 64 * MiB
    max_cached_responses: int = 512
    max_cached_bytes: int = 256 * MiB
    max_in_flight: int = 16
    max_streams: int = 32
    max_queued: int = 1024
    max_queued_bytes: int = 256 * MiB
    max_turn_seconds: float | None = None
    max_send_stall_seconds: float = 60.0
    max_idle_seconds: float | None = 900.0
    shutdown_grace_seconds: float = 30.0
    max_pending_steers: int = 16
    max_steer_bytes: int = 16 * MiB
    max_memory_bytes: int = 2048 * MiB
    max_stored_bytes_per_principal: int | None = 1024 * MiB
    store_wait_seconds: float = 1.0
    store_read_seconds: float = 5.0
    store_write_seconds: float = 15.0
    after_response_grace_seconds: float = 5.0
    abandon_handler_seconds: float = 5.0
    close_timeout_seconds: float = 1.0
    max_buffered_answer_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None and field.name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"Limits.{field.name} must be a positive number, got {value!r}.")
            if not field.name.endswith("_seconds") and not isinstance(value, int):
                raise ConfigError(f"Limits.{field.name} must be an integer, got {value!r}.")


_OPTIONAL = frozenset(
    {
        "max_turn_seconds",
        "max_idle_seconds",
        "max_connections_per_client",
        "max_stored_bytes_per_principal",
    }
)
