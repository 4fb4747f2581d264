"""Python's garbage collector made cheaper for a server holding many sockets.

Every socket keeps its state and its cache alive for as long as it is open, so each of the
collector's full collections walks hundreds of thousands of live objects none of which is
garbage: under 1,000 sockets that was a quarter of the server's CPU. `tune_gc` is what a
server process does about it once its app is built; `ws_mode.server.Server` calls it at
startup. Server-agnostic: no uvicorn needed.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_THRESHOLD", "tune_gc"]

#: The first generation's threshold `Server` gives Python's garbage collector: allocations
#: (less deallocations) between two young collections, against Python's 700.
GC_THRESHOLD: Final = 50_000


def tune_gc(threshold: int = GC_THRESHOLD) -> None:
    """Make Python's cyclic garbage collector cheaper for a long-running server.

    Everything alive now (the modules, the app) is moved out of the collector's sight
    (`gc.freeze()`: it lives as long as the process anyway), and young collections run every
    `threshold` allocations instead of every 700, so the objects of a turn are mostly freed by
    reference counting before a collection sees them, and fewer survive into the old
    generation, whose collections walk every live object (each socket's state, its cache).
    Reference counting still frees everything else at once; only cyclic garbage waits longer.
    Call it once the app is built, before serving; `Server` does at startup.
    """
    if threshold < 1:
        raise ValueError(f"the threshold must be at least 1, got {threshold}")
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)
