"""Counters a deployment watches: connections, turns, the cache, the store, bytes saved,
errors, latency, the memory budget, the tokens responses used.

One `Stats` per middleware: `middleware.stats.snapshot()` returns plain numbers, JSON-safe (for
logs or a health endpoint), under the keys of one table, `METRICS`, from which
`ws_mode.prometheus` makes its metrics too, so a number cannot be counted and not exported.
Every `Stats` of the process can be found without its middleware (`live_stats()`): that is how
`ws_mode.prometheus.metrics_app()` exports every middleware with no lookup.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

from ._budget import MemoryBudget
from ._logs import cut

if TYPE_CHECKING:
    from ._tap import Usage

#: Upper bounds (seconds) of the turn latency histogram's buckets; the last is +Inf.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Upper bounds of the prompt-cache ratio histogram's buckets (`cached_tokens / input_tokens`
#: of one turn); the last is +Inf.
CACHE_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
#: The `turn` label of the ratio: a chain's first turn (which a prefix cache can only hit
#: for a shared prompt) or a continuation (which should hit, on the replica holding it).
TURN_KINDS: Final = ("first", "continuation")
#: The last bucket's bound as `snapshot()` and Prometheus write it (JSON has no infinity).
INF_BOUND = "+Inf"

#: The kinds of tokens counted, as `snapshot()["tokens"]` and the Prometheus `kind` label name
#: them: a response's `usage.input_tokens`, `.input_tokens_details.cached_tokens` (a part of
#: the input), `.output_tokens` and `.output_tokens_details.reasoning_tokens` (a part of the
#: output).
TOKEN_KINDS: Final = ("input", "cached_input", "output", "reasoning")
#: How many models get token counts of their own, the first to report usage (their names as
#: the response objects give them, cut as log values are): a bound on the Prometheus series
#: (4 per model) and on what a `Stats` keeps, whatever model names a handler or an upstream
#: echoes. The models after them, and a response that names none, count under `OTHER_LABEL`.
MODEL_LABELS: Final = 64
#: How many error codes get a count of their own, the first to be sent (cut as log values
#: are): a bound on the Prometheus series and on what a `Stats` keeps, whatever codes a handler
#: or an upstream puts in its errors. The codes after them count under `OTHER_LABEL`.
ERROR_CODE_LABELS: Final = 64
#: The label the values past a label's bound (`MODEL_LABELS`, `ERROR_CODE_LABELS`) are counted
#: under.
OTHER_LABEL: Final = "other"

#: What a number is: one that only grows, one that goes up and down, counts by error code
#: (`{code: count}`), the turn latency's histogram, token counts by model and kind, or a
#: histogram by model and kind of turn (the prompt-cache ratio).
Kind = Literal[
    "counter", "gauge", "counters by code", "histogram", "tokens by model", "histogram by model"
]


class Metric(NamedTuple):
    """One key of `Stats.snapshot()`: its name, its kind, and what it means (the metric's help
    text in Prometheus, its row in the docs)."""

    key: str
    kind: Kind
    help: str


#: Every key `Stats.snapshot()` gives, once, in the order it gives them. `snapshot()` is made
#: from this table (a key not here is not given), and so is `ws_mode.prometheus`. The memory
#: budget's numbers are there when the middleware has a budget.
METRICS: tuple[Metric, ...] = (
    Metric("connections_open", "gauge", "Open WebSocket mode connections."),
    Metric("connections_total", "counter", "WebSocket mode connections accepted."),
    Metric(
        "connections_refused", "counter", "WebSocket mode upgrades refused (limits, off, auth)."
    ),
    Metric("turns", "counter", "Handler calls made for generated responses."),
    Metric("turns_failed", "counter", "Handler calls whose response failed or errored."),
    Metric(
        "handlers_abandoned",
        "counter",
        "Handler calls still running abandon_handler_seconds after ws_mode cancelled them.",
    ),
    Metric("warm_ups", "counter", "generate: false warm-ups answered without calling the handler."),
    Metric(
        "cache_hits",
        "counter",
        "Requests whose previous_response_id was cached on the connection.",
    ),
    Metric("cache_misses", "counter", "Requests whose previous_response_id was not cached there."),
    Metric("cache_evictions", "counter", "Responses evicted from connection caches."),
    Metric("bytes_received", "counter", "Bytes of client frames received."),
    Metric(
        "bytes_saved",
        "counter",
        "Context bytes clients did not re-send, joined from the cache.",
    ),
    Metric(
        "store_hydrations",
        "counter",
        "Parents missing from a connection cache, found in the store.",
    ),
    Metric("store_writes", "counter", "Records written to the store."),
    Metric(
        "store_failures",
        "counter",
        "Store reads and writes that failed, timed out or were cut.",
    ),
    Metric(
        "store_refused",
        "counter",
        "Conversations not stored: over max_stored_bytes_per_principal.",
    ),
    Metric(
        "store_dropped",
        "counter",
        "Conversations dropped to keep a principal within its bound.",
    ),
    Metric(
        "memory_bytes", "gauge", "Bytes WebSocket mode holds in this process (the memory budget)."
    ),
    Metric("memory_held_bytes", "gauge", "This middleware's part of the memory budget's use."),
    Metric("memory_limit_bytes", "gauge", "The memory budget: Limits.max_memory_bytes."),
    Metric("memory_peak_bytes", "gauge", "The most the memory budget has held."),
    Metric(
        "memory_refusals",
        "counter",
        "Work refused because the memory budget could not hold it.",
    ),
    Metric("errors", "counters by code", "Error events sent to clients, by code."),
    Metric(
        "turn_latency",
        "histogram",
        "Time from a handler call's start to its response's terminal event.",
    ),
    Metric(
        "tokens",
        "tokens by model",
        "Tokens the responses' usage reported, by model and kind.",
    ),
    Metric(
        "prompt_cache_ratio",
        "histogram by model",
        "Share of each turn's input tokens read from the prompt cache, by model and turn.",
    ),
)

#: Every `Stats` of the process still in use, by the order they were made (`live_stats()`).
_LIVE: weakref.WeakValueDictionary[int, Stats] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()
_SERIALS = itertools.count()


def live_stats() -> list[Stats]:
    """Every `Stats` of this process still in use (one per middleware), oldest first.

    A middleware the application let go is gone once Python's garbage collector has freed it
    (its parts refer to each other, so that waits for a collection)."""
    with _LIVE_LOCK:
        return [stats for _serial, stats in sorted(_LIVE.items())]


def bounded_label(value: str, labelled: Collection[str], bound: int) -> str:
    """`value` as a label of a metric whose values come from a handler or an upstream: cut as
    log values are (`ws_mode._logs.cut`), and `OTHER_LABEL` when it is not among `labelled`
    (the labels counted so far) and `bound` labels other than `OTHER_LABEL` are taken. That
    bounds the series, and what a `Stats` keeps, whatever values arrive."""
    label = cut(value)
    if label not in labelled and len(labelled) - (OTHER_LABEL in labelled) >= bound:
        return OTHER_LABEL
    return label


def bound_label(bound: float) -> str:
    """A latency bucket's bound as text, as Prometheus's `le` label writes it: `0.005`, `1.0`,
    `+Inf`."""
    return INF_BOUND if bound == float("inf") else repr(bound)


class Stats:
    """Counters of one middleware. Everything counts since the middleware was created."""

    #: How `ws_mode.prometheus.metrics_app()` tells this middleware from the others of the
    #: process: its `middleware` label. None: `default` (`default-2`, `default-3`, ... for
    #: other unnamed ones, in the order they were made).
    name: str | None = None

    def __init__(self) -> None:
        with _LIVE_LOCK:
            _LIVE[next(_SERIALS)] = self
        self.connections_open = 0
        self.connections_total = 0
        self.connections_refused = 0
        self.turns = 0
        self.warm_ups = 0
        self.turns_failed = 0
        self.handlers_abandoned = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.bytes_received = 0
        self.bytes_saved = 0
        #: Responses loaded from the store (`store=`) into a connection's cache; records
        #: written; lookups and writes that failed (a write cancelled too).
        self.store_hydrations = 0
        self.store_writes = 0
        self.store_failures = 0
        #: Records not stored because their conversation alone exceeds
        #: `Limits.max_stored_bytes_per_principal`, and conversations dropped to keep a
        #: principal within it.
        self.store_refused = 0
        self.store_dropped = 0
        self.errors: Counter[str] = Counter()
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        #: Token counts by model label, in the order of `TOKEN_KINDS`.
        self._tokens: dict[str, list[int]] = {}
        #: The prompt-cache ratio by (model label, `TURN_KINDS` kind): the bucket counts, the
        #: sum of the ratios.
        self._ratios: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        self._closed_evictions = 0
        #: Reads the evictions of the caches of open connections (set by the middleware).
        self.live_evictions: Callable[[], int] = lambda: 0
        #: The middleware's share of the process's memory budget (set by the middleware).
        self.budget: MemoryBudget | None = None

    @property
    def cache_evictions(self) -> int:
        """Responses evicted from connection caches (by the bounds, or a failed continuation)."""
        return self._closed_evictions + self.live_evictions()

    def connection_closed(self, evictions: int) -> None:
        """A connection ended; keep its cache's evictions."""
        self.connections_open -= 1
        self._closed_evictions += evictions

    def error(self, code: str | None) -> None:
        """An error event was sent to a client: counted under its code (`unknown` for none),
        at most `ERROR_CODE_LABELS` of them (`bounded_label`)."""
        errors = self.errors
        errors[bounded_label(code or "unknown", errors, ERROR_CODE_LABELS)] += 1

    def turn_finished(self, seconds: float, *, failed: bool) -> None:
        """A handler call ended after `seconds` (from its start to its terminal event)."""
        self.latency_buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds
        if failed:
            self.turns_failed += 1

    def count_tokens(
        self, model: str | None, usage: Usage, *, continuation: bool | None = None
    ) -> None:
        """A response ended reporting `usage`; `model` is the model its response object names.
        With `continuation` (whether the turn continued a response), its prompt-cache ratio
        (`Usage.cache_ratio`) goes in the histogram too."""
        tokens = self._tokens
        label = bounded_label(model, tokens, MODEL_LABELS) if model is not None else OTHER_LABEL
        counts = tokens.get(label)
        if counts is None:
            counts = tokens[label] = [0, 0, 0, 0]
        input_tokens, cached_tokens, output_tokens, reasoning_tokens = usage
        counts[0] += input_tokens
        counts[1] += cached_tokens
        counts[2] += output_tokens
        counts[3] += reasoning_tokens
        ratio = usage.cache_ratio
        if continuation is not None and ratio is not None:
            kind = TURN_KINDS[continuation]
            found = self._ratios.get((label, kind))
            if found is None:
                found = self._ratios[(label, kind)] = ([0] * (len(CACHE_RATIO_BUCKETS) + 1), [0.0])
            found[0][bisect_left(CACHE_RATIO_BUCKETS, ratio)] += 1
            found[1][0] += ratio

    def _token_counts(self) -> dict[str, Any]:
        """The tokens counted: a total by kind, and `by_model`, each model label's counts by
        kind."""
        totals = [0, 0, 0, 0]
        by_model: dict[str, dict[str, int]] = {}
        for model, counts in self._tokens.items():
            by_model[model] = dict(zip(TOKEN_KINDS, counts, strict=True))
            totals = [total + count for total, count in zip(totals, counts, strict=True)]
        return {**dict(zip(TOKEN_KINDS, totals, strict=True)), "by_model": by_model}

    def _memory(self) -> dict[str, int]:
        """The memory budget (`Limits.max_memory_bytes`): what WebSocket mode holds in this
        process (every middleware of it), this middleware's part, the limit, the most ever
        held, and the reservations refused (work answered `server_is_overloaded`)."""
        budget = self.budget
        if budget is None:
            return {}
        return {
            "memory_bytes": budget.used,
            "memory_held_bytes": budget.held,
            "memory_limit_bytes": budget.limit,
            "memory_peak_bytes": budget.account.peak,
            "memory_refusals": budget.refusals,
        }

    def _latency(self) -> dict[str, Any]:
        """The turn latency as Prometheus keeps a histogram: cumulative counts by upper bound
        (as text, the last `+Inf`), the count and the sum of seconds."""
        return _histogram(LATENCY_BUCKETS, self.latency_buckets, self.latency_sum)

    def _cache_ratios(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The prompt-cache ratio's histograms (as `_latency`'s), by model label and by kind
        of turn (`TURN_KINDS`)."""
        by_model: dict[str, dict[str, dict[str, Any]]] = {}
        for (model, kind), (counts, total) in list(self._ratios.items()):
            histogram = _histogram(CACHE_RATIO_BUCKETS, counts, total[0])
            by_model.setdefault(model, {})[kind] = histogram
        return by_model

    def snapshot(self) -> dict[str, Any]:
        """Every key of `METRICS` (the memory budget's with a budget): counters and gauges as
        plain numbers, `errors` as `{code: count}`, `turn_latency` as cumulative histogram
        buckets, `tokens` as totals by kind and `by_model`. Only strings, numbers and dicts:
        `json.dumps(..., allow_nan=False)` takes it."""
        values: dict[str, Any] = {
            "errors": dict(self.errors),
            "turn_latency": self._latency(),
            "tokens": self._token_counts(),
            "prompt_cache_ratio": self._cache_ratios(),
            **self._memory(),
        }
        return {
            metric.key: values[metric.key] if metric.key in values else getattr(self, metric.key)
            for metric in METRICS
            if not metric.key.startswith("memory_") or metric.key in values
        }


def _histogram(bounds: tuple[float, ...], counts: list[int], total: float) -> dict[str, Any]:
    """A histogram as Prometheus keeps one: cumulative counts by upper bound (as text, the
    last `+Inf`), the count and the sum."""
    buckets: dict[str, int] = {}
    seen = 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        seen += count
        buckets[bound_label(bound)] = seen
    return {"buckets": buckets, "count": seen, "sum": total}
