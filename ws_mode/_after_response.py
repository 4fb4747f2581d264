"""Work that follows a finished response and must not delay the next turn: rendering its
output (with a `renderer`), the `on_response` hook, a handler still running after its
terminal event. The connection gives it a grace period when it closes. Store writes are not
here: they belong to the process and outlive the connection (`ws_mode._persistence`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from . import _logs as logs
from ._cache import CachedResponse
from ._hooks import HookFailed, call_hook
from ._logs import for_log
from ._settings import Settings
from ._socket import ClientGone
from ._tap import Usage
from ._turn import Turn

logger = logging.getLogger(__name__)


class AfterResponses:
    """One connection's work after its responses."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, node: CachedResponse | None, current: Turn, response: dict[str, Any]) -> None:
        """Start the work that follows a finished response, without waiting for it; `node`
        is its cache entry, None for a response that failed (only the hook runs).

        `response` is the terminal response object the metrics read the response's usage
        from: `current.usage` gets the same counts (`Usage.of`), so a hook bills exactly what
        the metrics count."""
        current.usage = Usage.of(response)
        if self.settings.on_response is None and (node is None or self.settings.renderer is None):
            return
        self.track(asyncio.create_task(self._run(node, current, response)))

    def track(self, task: asyncio.Task[None]) -> None:
        """Track work that outlives its turn, so the connection can finish it on close."""
        self._tasks.add(task)
        task.add_done_callback(_log_failure)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, node: CachedResponse | None, current: Turn, response: dict[str, Any]
    ) -> None:
        await asyncio.sleep(0)  # let the terminal event go out first
        said = for_log(response.get("id"))
        try:
            if node is not None:
                node.tokens  # noqa: B018  (render the output now, while the client runs its tools)
        except HookFailed as exc:
            then = f"rendering the output of {said}; a turn continuing it fails"
            logs.hook_raised(logger, exc.hook, exc.__cause__, then)
        except Exception:
            logger.exception("post-response work failed for %s", said)
        hook = self.settings.on_response
        if hook is None:
            return
        try:
            await call_hook(hook, current, response)
        except Exception as exc:
            then = f"after {said}, which the client has; the socket goes on"
            logs.hook_raised(logger, "on_response", exc, then)

    async def finish(self) -> None:
        """Give work still running a grace period (`Limits.after_response_grace_seconds`),
        then cancel it; return once it has ended.

        The connection's task may itself be cancelled (a server's shutdown timeout): then the
        work gets no grace, and is cancelled with it, never left pending on a loop about to
        close (Python's "Task was destroyed but it is pending!")."""
        tasks = set(self._tasks)
        if not tasks:
            return
        current = asyncio.current_task()
        cancelled = current is not None and current.cancelling() > 0
        grace = 0.0 if cancelled else self.settings.limits.after_response_grace_seconds
        try:
            await asyncio.wait(tasks, timeout=grace)
        finally:
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)


def _log_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, ClientGone):
        logger.error("work after a response failed", exc_info=error)
