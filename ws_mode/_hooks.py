"""Calling the application's hooks (`authenticate`, `on_response`, `handshake_headers`) without
blocking the event loop, and without making them wait for each other; and telling their
failures apart from ws_mode's own (`HookFailed`).

- An async hook (an ``async def``, an object whose ``__call__`` is one, or a function wrapped
  in asgiref's ``sync_to_async``) is awaited on the event loop.
- A plain function runs in a worker thread of ws_mode's own pool (`HOOK_THREADS` threads,
  made on first use), so the sync hooks of many sockets run at once: ten handshakes whose hook
  takes 0.2 s (a database, an auth service) are accepted in 0.23 s, not 2.0 s. The pool is
  ws_mode's, not the event loop's default executor, so hooks that hang cannot starve what
  else runs there (name lookups for Redis and upstreams); more than `HOOK_THREADS` calls at
  once wait for a thread.
- **Django**, when its settings are configured in this process: a plain function runs through
  ``sync_to_async(thread_sensitive=True)``, in the one thread Django gives sync code outside
  a request, as Django requires of code that touches its ORM (its connections are per thread).
  Those calls run one at a time per process.

The `renderer` and a `principal_key` function are not run in a thread: they are plain
functions ws_mode calls inline, on the event loop, where it needs their answer (docs/handlers.md,
"How hooks run"); the renderer is wrapped once (`guarded_renderer`) so that what it raises is
known to be its own.

To choose yourself, pass the hook already wrapped: ``sync_to_async(hook)`` runs every call in
that one thread (for code that is not thread-safe), ``sync_to_async(hook,
thread_sensitive=False)`` a Django hook in any thread (close the ORM's connections yourself:
``django.db.close_old_connections``); or write the hook ``async``.
"""

from __future__ import annotations

import inspect
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from asgiref.sync import iscoroutinefunction, sync_to_async

#: How many sync hook calls run at once in a process (threads of ws_mode's own pool). The pool
#: is the process's, shared by every middleware in it (as the event loop's default executor
#: is), so this is not a per-middleware `Limits` field; hooks that need more concurrency than
#: this are written `async`.
HOOK_THREADS: Final = 32

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class HookFailed(Exception):
    """A hook of the application raised (`hook` names it by its keyword; the exception it
    raised is this one's cause). Caught where ws_mode reports it: the log line names the hook
    and its exception (`ws_mode._logs.hook_raised`), the client's error names the hook
    (`ws_mode._protocol.hook_failed`), never the exception."""

    def __init__(self, hook: str) -> None:
        super().__init__(f"the application's {hook} raised")
        self.hook = hook


def guarded_renderer(
    renderer: Callable[[list[dict[str, Any]]], Iterable[int]],
) -> Callable[[list[dict[str, Any]]], Sequence[int]]:
    """`renderer` as ws_mode calls it: what it returns read at once (a generator that fails
    fails here, not later as ws_mode copies its tokens), and whatever it raises raised as
    `HookFailed("renderer")`, so the turn it fails says whose error it is."""

    def render(items: list[dict[str, Any]]) -> Sequence[int]:
        try:
            tokens = renderer(items)
            return tokens if isinstance(tokens, list | tuple | array) else list(tokens)
        except Exception as exc:
            raise HookFailed("renderer") from exc

    return render


def is_async(hook: Callable[..., Any]) -> bool:
    """Whether calling `hook` gives a coroutine (an async function, or an object whose
    `__call__` is one)."""
    method = type(hook).__call__ if not inspect.isroutine(hook) else None
    return iscoroutinefunction(hook) or (method is not None and iscoroutinefunction(method))


def django_configured() -> bool:
    """Whether this process runs a Django project: Django imported, its settings configured."""
    conf = sys.modules.get("django.conf")
    if conf is None:
        return False
    try:
        return bool(conf.settings.configured)
    except Exception:  # an unusual Django, or one half set up: be safe, as Django asks
        return True


def _hook_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(HOOK_THREADS, thread_name_prefix="ws_mode-hook")
        return _pool


async def call_hook(hook: Callable[..., Any], *args: Any) -> Any:
    """Call `hook(*args)` off the event loop unless it is async (see the module's docstring
    for which thread); await what it returns when that is awaitable (a sync function may hand
    back a coroutine)."""
    if is_async(hook):
        result = hook(*args)
    elif django_configured():
        result = await sync_to_async(hook, thread_sensitive=True)(*args)
    else:
        result = await sync_to_async(hook, thread_sensitive=False, executor=_hook_pool())(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
