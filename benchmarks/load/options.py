"""The load test's options: the command line's bounds, :class:`LoadOptions`, and the memory model
the sockets' peak RSS is held to (:func:`rss_bound`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ws_mode._gc import GC_THRESHOLD

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the options


#: Chains differ by their first user message; this many distinct ones are run (and checked
#: over HTTP once each).
VARIANTS: Final = 8

# Bounds of the command line: a load test, not a denial of service.
MAX_CONNECTIONS: Final = 2000
MAX_TURNS: Final = 200
MAX_LANES: Final = 16
MAX_TOOL_OUTPUT_BYTES: Final = 1024 * 1024
MAX_DURATION: Final = 3600.0
MAX_ROUNDS: Final = 20
#: ``--long``: the chains of an agent with longer histories (about 100 KiB by the last turn),
#: where HTTP re-sends and re-reads the whole history every turn.
LONG_TURNS: Final = 25
LONG_TOOL_OUTPUT_BYTES: Final = 4096

# The memory model of `rss_bound` (see there). Measured on CPython 3.11, uvicorn 0.54 with
# websockets 15 (permessage-deflate on, as the openai SDK asks), glibc malloc:
#: What one open socket costs the server beyond its cache: uvicorn's protocol object and its
#: buffers, the websockets state machine and its deflate contexts, the ASGI queues, ws_mode's
#: Connection and its tasks. Measured: 100 KiB per socket (600 sockets, one turn each).
PER_CONNECTION_BYTES: Final = 160 * 1024
#: What one byte the caches count (their encoded items and response objects) costs in RSS,
#: together with the turns in flight: each cached response keeps its items both encoded (the
#: bytes counted) and decoded (dicts and strings), its response object decoded, its rendered
#: tokens (with a renderer), plus the request bodies and handler work of running turns.
#: Measured: 3.5 with full_context="always", 5.1 with "on_miss" and the reference renderer
#: (300 sockets x 2.5 lanes x 10 turns x 8 KiB tool outputs), once cached fragments are
#: exact-size (see docs/limits.md: orjson's over-allocated output multiplies this by up to 16).
CACHE_OVERHEAD_FACTOR: Final = 6.0
#: The allocator's arenas and fragmentation, the client threads of the HTTP reference run.
SLACK_BYTES: Final = 64 * 1024 * 1024


class LoadError(Exception):
    """The load test could not run (the server did not start, a bad option)."""


@dataclass(frozen=True)
class LoadOptions:
    """What one load run does (see the module docstring and ``--help``)."""

    connections: int = 300
    turns: int = 5
    lanes: int = 4
    tool_output_bytes: int = 1024
    duration: float = 300.0
    full_context: str = "always"
    tokens_per_second: float = 0.0
    max_cached_bytes: int = 8 * 1024 * 1024
    max_cached_responses: int = 512
    connect_concurrency: int = 64
    turn_timeout: float = 60.0
    #: Also run the same conversations over plain HTTP (full history, SSE) at the same
    #: concurrency, against the same server process.
    http: bool = True
    #: Whether the sockets ask for permessage-deflate (the openai SDK does).
    compression: bool = True
    #: Rounds of both sides; even rounds run the sockets first, odd ones HTTP first.
    rounds: int = 1
    #: The server's uvicorn WebSocket implementation, as ``ws-mode serve --ws`` names it.
    ws: str = "batched"
    #: The server's garbage collector, as ``ws-mode serve`` sets it (``ws_mode.tune_gc``
    #: with this threshold); 0 leaves Python's as it is.
    gc_threshold: int = GC_THRESHOLD

    def __post_init__(self) -> None:
        checks = (
            ("connections", self.connections, 1, MAX_CONNECTIONS),
            ("turns", self.turns, 1, MAX_TURNS),
            ("lanes", self.lanes, 1, MAX_LANES),
            ("tool_output_bytes", self.tool_output_bytes, 1, MAX_TOOL_OUTPUT_BYTES),
            ("duration", self.duration, 1.0, MAX_DURATION),
            ("connect_concurrency", self.connect_concurrency, 1, MAX_CONNECTIONS),
            ("max_cached_bytes", self.max_cached_bytes, 1024, 1 << 40),
            ("max_cached_responses", self.max_cached_responses, 1, 1 << 20),
            ("turn_timeout", self.turn_timeout, 0.1, MAX_DURATION),
            ("rounds", self.rounds, 1, MAX_ROUNDS),
            ("gc_threshold", self.gc_threshold, 0, 1 << 30),
        )
        for name, value, low, high in checks:
            if not low <= value <= high:
                raise LoadError(f"{name} must be between {low} and {high}, got {value}.")
        if self.full_context not in ("always", "on_miss"):
            raise LoadError(
                f"full_context must be 'always' or 'on_miss', not {self.full_context!r}."
            )
        if self.tokens_per_second < 0:
            raise LoadError("tokens_per_second must be >= 0.")

    def lanes_of(self, connection: int) -> int:
        """How many lanes connection number `connection` runs: 1 to `lanes`, in turn."""
        return 1 + connection % self.lanes

    @property
    def conversations(self) -> int:
        """How many conversations run at once: the lanes of every socket."""
        return sum(self.lanes_of(index) for index in range(self.connections))

    def variant_of(self, connection: int, lane: int) -> int:
        """Which of the :data:`VARIANTS` chains lane number `lane` of `connection` runs."""
        return (connection * self.lanes + lane) % VARIANTS


def rss_bound(rss_at_rest: int, connections: int, cache_bytes: int) -> int:
    """The most the server's RSS may reach: at rest, plus each open socket's fixed cost, plus
    what its caches count times the cost of a counted byte, plus slack (the constants above).

    `cache_bytes` is the sum over connections of what each cache counts: the bytes of every
    turn of its chains, at most `max_cached_bytes` per connection. So the bound grows with the
    cache limits and the open sockets, never with the number of turns served. The load's
    conversations fit their caches, so nothing is evicted (a cache that evicts keeps the
    evicted ancestors of live responses alive, which this bound does not cover).
    """
    return int(
        rss_at_rest
        + connections * PER_CONNECTION_BYTES
        + cache_bytes * CACHE_OVERHEAD_FACTOR
        + SLACK_BYTES
    )
