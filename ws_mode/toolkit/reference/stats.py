"""The reference server's work counters: what its handler parsed, rendered and spent CPU on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["ReferenceStats"]


@dataclass(eq=False)
class ReferenceStats:
    """Work counters of one reference app, kept on ``app.state.reference_stats``.

    Attributes:
        requests: ``POST`` requests received (failed ones included).
        bytes_parsed: request body bytes JSON-decoded.
        items_seen: context items the handler looked at: the whole context on a stateless
            request, only the new items on a continuation resumed from its parent's artifacts.
        tokens_rendered: tokens the handler rendered itself (context items, instructions, and
            the output kept for the next turn); not those a middleware ``renderer`` made.
        resumed: requests answered from the parent's artifacts instead of the whole context.
        cpu_seconds: CPU time of the handler's own work (parse, render, digest, script, event
            encoding), measured on the thread that runs it; streaming pauses are not counted.
    """

    requests: int = 0
    bytes_parsed: int = 0
    items_seen: int = 0
    tokens_rendered: int = 0
    resumed: int = 0
    cpu_seconds: float = 0.0

    def reset(self) -> None:
        """Set every counter back to zero."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, field.default)

    def snapshot(self) -> dict[str, int | float]:
        """The counters as a plain dict."""
        return dataclasses.asdict(self)
