"""The load's report: per side (:class:`SideReport`) and for the run (:class:`LoadReport`), as
text and JSON, with the ratios WebSocket/HTTP and the RSS bound's verdict."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ws_mode.toolkit.measure import format_bytes, percentile

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the report
# A SideReport adds up the rounds of one side; a LoadReport holds both sides, the memory bound
# the sockets' peak must stay under, the ratios WebSocket/HTTP, its text table and its JSON.


#: The figures compared WebSocket/HTTP: (name, SideReport attribute).
RATIOS: Final = (
    ("turns_per_second", "turns_per_second"),
    ("latency_p50", "latency_p50_ms"),
    ("latency_p99", "latency_p99_ms"),
    ("latency_max", "latency_max_ms"),
    ("server_cpu_per_turn", "server_cpu_ms_per_turn"),
    ("client_cpu_per_turn", "client_cpu_ms_per_turn"),
    ("server_rss_peak", "rss_peak"),
)


@dataclass
class SideReport:
    """One side of the load (``websocket`` or ``http``), over every round it ran.

    ``connections`` is what the clients opened (sockets, or HTTP keep-alive connections);
    ``server_connections`` what the server saw: the sockets open at once before the first turn
    (the fewest over the rounds), or the distinct HTTP connections that sent requests (the most
    over the rounds: one more than a conversation's means a connection was not kept alive).
    Connections, turns, seconds and CPU time add up over the rounds; ``rss_start`` (the
    server's RSS before the side connects, the previous side's memory released) and
    ``rss_peak`` are the highest over the rounds.
    """

    transport: str
    connections_expected: int = 0
    connections: int = 0
    server_connections: int = 0
    conversations: int = 0
    turns: int = 0
    turns_expected: int = 0
    seconds: float = 0.0
    turns_per_second: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    server_cpu_seconds: float = 0.0
    server_cpu_ms_per_turn: float = 0.0
    client_cpu_seconds: float = 0.0
    client_cpu_ms_per_turn: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0
    #: Each round's server RSS at the side's start and its peak: ``[start, peak]``.
    rss_rounds: list[list[int]] = field(default_factory=list)
    rounds: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        """Every turn of every round ran and was right, every connection opened and was used
        as one conversation's (or one socket's), and nothing failed."""
        return (
            not self.errors
            and self.rounds > 0
            and self.turns == self.turns_expected
            and self.connections == self.connections_expected * self.rounds
            and self.server_connections == self.connections_expected
        )

    def finish(self) -> None:
        """Work the rates and percentiles out of the totals (after the last round)."""
        self.turns_per_second = self.turns / self.seconds if self.seconds else 0.0
        self.latency_p50_ms = percentile(self.latencies, 0.50) * 1000
        self.latency_p99_ms = percentile(self.latencies, 0.99) * 1000
        self.latency_max_ms = max(self.latencies, default=0.0) * 1000
        per_turn = 1000 / self.turns if self.turns else 0.0
        self.server_cpu_ms_per_turn = self.server_cpu_seconds * per_turn
        self.client_cpu_ms_per_turn = self.client_cpu_seconds * per_turn

    def summary(self) -> dict[str, Any]:
        """The report's fields, without the raw latencies."""
        fields = asdict(self)
        del fields["latencies"]
        return {**fields, "ok": self.ok}


@dataclass
class LoadReport:
    """What one load run measured: the socket side, the HTTP side (None with ``http=False``),
    the server's memory and counters."""

    options: dict[str, Any]
    websocket: SideReport = field(default_factory=lambda: SideReport("websocket"))
    http: SideReport | None = None
    server_pid: int = 0
    rss_at_rest: int = 0
    rss_after: int = 0
    rss_bound: int = 0
    rss_source: str = ""
    cache_bytes_expected: int = 0
    server_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Both sides ran every turn right, and the server stayed within its memory bound
        while the sockets ran."""
        return (
            self.websocket.ok
            and (self.http is None or self.http.ok)
            and 0 < self.websocket.rss_peak <= self.rss_bound
        )

    def ratios(self) -> dict[str, float]:
        """WebSocket/HTTP for each of :data:`RATIOS` (empty without an HTTP side; a figure
        HTTP measured as 0 is left out)."""
        if self.http is None:
            return {}
        return {
            name: getattr(self.websocket, attribute) / getattr(self.http, attribute)
            for name, attribute in RATIOS
            if getattr(self.http, attribute)
        }

    def to_json(self) -> str:
        """The report as JSON: both sides, the ratios, ``ok``."""
        fields = {
            name: value for name, value in asdict(self).items() if name not in ("websocket", "http")
        }
        document = {
            **fields,
            "websocket": self.websocket.summary(),
            "http": None if self.http is None else self.http.summary(),
            "ratios": self.ratios(),
            "ok": self.ok,
        }
        return json.dumps(document, indent=2, sort_keys=True)

    def text(self) -> str:
        """The report as a table, a column per side and one for WebSocket/HTTP."""
        sides = [self.websocket] if self.http is None else [self.websocket, self.http]
        ratios = self.ratios()
        rows: list[tuple[str, list[str], str]] = [
            ("rounds", [str(s.rounds) for s in sides], ""),
            ("connections", [f"{s.connections // max(1, s.rounds)} a round" for s in sides], ""),
            ("  server saw", [str(s.server_connections) for s in sides], ""),
            ("conversations", [str(s.conversations) for s in sides], ""),
            ("turns", [f"{s.turns} of {s.turns_expected}" for s in sides], ""),
            ("seconds", [f"{s.seconds:.2f}" for s in sides], ""),
        ]
        figures = (
            ("turns/s", "turns_per_second", "{:.0f}"),
            ("p50 turn ms", "latency_p50", "{:.1f}"),
            ("p99 turn ms", "latency_p99", "{:.1f}"),
            ("max turn ms", "latency_max", "{:.1f}"),
            ("server CPU/turn ms", "server_cpu_per_turn", "{:.2f}"),
            ("client CPU/turn ms", "client_cpu_per_turn", "{:.2f}"),
        )
        for label, name, shape in figures:
            attribute = dict(RATIOS)[name]
            rows.append((label, [shape.format(getattr(s, attribute)) for s in sides], name))
        rows.append(("server RSS by round", [_rounds(s.rss_rounds) for s in sides], ""))
        rows.append(
            ("server peak RSS", [format_bytes(s.rss_peak) for s in sides], "server_rss_peak")
        )
        rows.append(("errors", [_errors(s.errors) for s in sides], ""))
        header = ["", *(s.transport for s in sides), *(["WS/HTTP"] if self.http else [])]
        table = [header]
        for label, values, ratio in rows:
            extra = [f"{ratios[ratio]:.2f}x" if ratio in ratios else ""] if self.http else []
            table.append([label, *values, *extra])
        widths = [max(len(row[column]) for row in table) for column in range(len(header))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in table
        ]
        lines.append(
            f"server RSS at rest {format_bytes(self.rss_at_rest)}, after "
            f"{format_bytes(self.rss_after)}; the sockets' peak must stay under "
            f"{format_bytes(self.rss_bound)} ({self.rss_source}; the caches count "
            f"{format_bytes(self.cache_bytes_expected)})"
        )
        threshold = self.options.get("gc_threshold")
        lines.append(
            f"server: uvicorn --ws {self.options.get('ws')}, garbage collector "
            + (
                f"tuned (young collections every {threshold} allocations)"
                if threshold
                else "as Python sets it"
            )
        )
        stats = self.server_stats
        if stats:
            lines.append(
                f"middleware stats: socket turns {stats.get('turns')}, cache hits "
                f"{stats.get('cache_hits')}, misses {stats.get('cache_misses')}, evictions "
                f"{stats.get('cache_evictions')}, bytes saved {stats.get('bytes_saved')}, "
                f"errors {stats.get('errors')}"
            )
        for side in sides:
            lines.extend(f"  {side.transport} e.g. {sample}" for sample in side.error_samples[:5])
        lines.append("result: " + ("OK" if self.ok else "FAILED"))
        return "\n".join(lines)


def _rounds(rss: list[list[int]]) -> str:
    """Each round's RSS at start and peak, in MiB: ``52→290, 138→281 MiB``."""
    mib = 1024 * 1024
    return ", ".join(f"{start / mib:.0f}→{peak / mib:.0f}" for start, peak in rss) + " MiB"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{kind}: {count}" for kind, count in sorted(errors.items())) or "none"
