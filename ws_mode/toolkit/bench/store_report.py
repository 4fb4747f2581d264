"""The store benchmark's options and report (:mod:`ws_mode.toolkit.bench.store` runs it).

:class:`StoreBenchOptions` says what to measure, :class:`StoreBenchReport` holds what was
measured, the ratios (:meth:`StoreBenchReport.ratios`) and the store's counters against what
the run expects of them, and prints as text or JSON: measurements and ratios only (the goals
are in docs/benchmarks.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ..measure import format_bytes, format_seconds

__all__ = ["StoreBenchError", "StoreBenchOptions", "StoreBenchReport"]

MIDDLEWARES: Final = {
    "always": "drop-in (full_context=always)",
    "on_miss": "cache-aware (full_context=on_miss, the reference's renderer)",
}


class StoreBenchError(Exception):
    """The run could not measure: the server did not start, a turn failed, answers differed."""


@dataclass(frozen=True)
class StoreBenchOptions:
    """What to measure (see the module's docstring)."""

    redis_url: str
    turns: int = 25
    tool_output_bytes: int = 4096
    repeat: int = 5
    chain_turns: int = 50
    sockets: int = 200
    socket_turns: int = 5
    full_context: str = "on_miss"
    store_timeout: float = 2.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in ("turns", "repeat", "chain_turns", "sockets", "socket_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.store_timeout <= 0:
            raise ValueError("store_timeout must be > 0")
        if self.full_context not in ("always", "on_miss"):
            raise ValueError(f"full_context must be always or on_miss, got {self.full_context!r}")
        if self.turns < 2:
            raise ValueError("turns must be >= 2 (a rollout continues a response)")


@dataclass
class StoreBenchReport:
    """What one run measured (times in seconds), and the store's counters."""

    options: dict[str, Any]
    prefix: str = ""  # the run's Redis keys' prefix
    turn: dict[str, float] = field(default_factory=dict)  # per mode: median turn
    rollout: dict[str, float] = field(default_factory=dict)  # per mode: median rollout
    cpu_per_turn: dict[str, float] = field(default_factory=dict)  # per mode: server CPU
    cached_turn: float = 0.0
    hydrated_turn: float = 0.0
    turns_per_second: dict[str, float] = field(default_factory=dict)  # per mode
    concurrent_turns: dict[str, int] = field(default_factory=dict)  # per mode, every run
    store: dict[str, int] = field(default_factory=dict)  # the store's counters
    expected: dict[str, int] = field(default_factory=dict)  # what they should be
    store_off: dict[str, int] = field(default_factory=dict)  # the storeless side's: zeros

    @property
    def ok(self) -> bool:
        """Whether the store did what the run expects, and nothing without one."""
        return self.store == self.expected and not any(self.store_off.values())

    def ratios(self) -> dict[str, float]:
        """With the store / without it (per turn, rollout, CPU, turns/s), and a hydrated turn
        / the same turn from the cache."""

        def ratio(values: dict[str, float]) -> float:
            return values["on"] / values["off"] if values.get("off") else 0.0

        return {
            "turn": ratio(self.turn),
            "rollout": ratio(self.rollout),
            "cpu_per_turn": ratio(self.cpu_per_turn),
            "turns_per_second": ratio(self.turns_per_second),
            "hydration": self.hydrated_turn / self.cached_turn if self.cached_turn else 0.0,
        }

    def to_json(self) -> str:
        """The report as JSON, the ratios included."""
        return json.dumps({**asdict(self), "ratios": self.ratios()}, indent=2)

    def text(self) -> str:
        """The report as the command prints it."""
        o, r, ms = self.options, self.ratios(), format_seconds
        size = format_bytes(o["tool_output_bytes"])
        rows = "\n".join(
            f"  {label:<9}{ms(self.turn[mode]):>11}{ms(self.rollout[mode]):>11}"
            f"{ms(self.cpu_per_turn[mode]):>18}"
            for mode, label in (("off", "no store"), ("on", "Redis"))
        )
        return "\n".join(
            [
                f"ws_mode.toolkit.bench.store: the Redis store against no store, both middlewares "
                f"{MIDDLEWARES[o['full_context']]}; server in its own process; medians of "
                f"{o['repeat']} repetitions, interleaved.",
                "",
                f"Per turn: a tool-call rollout of {o['turns']} turns, {size} tool outputs, "
                "the model at zero cost",
                f"  {'store':<9}{'turn':>11}{'rollout':>11}{'server CPU/turn':>18}",
                rows,
                f"  {'ratio':<9}{r['turn']:>11.3f}{r['rollout']:>11.3f}{r['cpu_per_turn']:>18.3f}",
                "",
                f"Hydration: one turn continuing a {o['chain_turns']}-turn conversation "
                "(send to terminal event)",
                f"  on the connection holding it in cache   {ms(self.cached_turn):>9}",
                f"  on a new socket, hydrated from Redis    {ms(self.hydrated_turn):>9}",
                f"  ratio {r['hydration']:.3f} (hydrating adds "
                f"{ms(self.hydrated_turn - self.cached_turn)})",
                "",
                f"Throughput: {o['sockets']} sockets at once, {o['socket_turns']} turns each",
                f"  no store {self.turns_per_second['off']:,.0f} turns/s, Redis "
                f"{self.turns_per_second['on']:,.0f} turns/s, ratio {r['turns_per_second']:.3f}",
                "",
                f"Store counters (RedisStore timeout {o['store_timeout']:g} s): "
                + ", ".join(
                    f"{name} {self.store.get(name, 0):,} (expected {self.expected[name]:,})"
                    for name in ("store_writes", "store_hydrations", "store_failures")
                ),
            ]
        )
