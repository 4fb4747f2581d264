"""Calling the application's hooks (`authenticate`, `on_response`) without blocking the event
loop: an async hook is awaited; a plain function runs in a worker thread through asgiref's
`sync_to_async`, thread-sensitive, as Django requires of code that touches its ORM, so a sync
hook may query a database or call a blocking API."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async

__all__ = ["call_hook", "is_async"]


def is_async(hook: Callable[..., Any]) -> bool:
    """Whether calling `hook` gives a coroutine (an async function, or an object whose
    `__call__` is one)."""
    method = type(hook).__call__ if not inspect.isroutine(hook) else None
    return iscoroutinefunction(hook) or (method is not None and iscoroutinefunction(method))


async def call_hook(hook: Callable[..., Any], *args: Any) -> Any:
    """Call `hook(*args)` off the event loop unless it is async; await what it returns when
    that is awaitable (a sync function may hand back a coroutine)."""
    if is_async(hook):
        result = hook(*args)
    else:
        result = await sync_to_async(hook, thread_sensitive=True)(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
