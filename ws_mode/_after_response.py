"""Work that follows a finished response and must not delay the next turn: rendering its
output (with a `renderer`), the `on_response` hook, a handler still running after its
terminal event, and a handler call ws_mode stopped (the turn is over for the client) while it
ends. The connection gives the first a grace period when it closes; a stopped handler call
gets `Limits.abandon_handler_seconds` to end, then it is abandoned (`HandlerCall.abandon`).
Store writes are not here: they belong to the process and outlive the connection
(`ws_mode._persistence`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from . import _logs as logs
from ._cache import CachedResponse
from ._handler_call import HandlerCall
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
        #: The handler calls among the tasks, and the turn each served (for the log).
        self._calls: dict[asyncio.Task[None], tuple[HandlerCall, str]] = {}
        #: The stopped ones, and when each is abandoned if it has not ended.
        self._timers: dict[asyncio.Task[None], asyncio.TimerHandle] = {}

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

    def track_call(self, handler: HandlerCall, call: asyncio.Task[None], turn: str) -> None:
        """Track a handler call still running after its terminal event (`turn` names the turn
        it served, for the log): it runs on, and the connection stops it when it closes."""
        self._calls[call] = (handler, turn)
        call.add_done_callback(self._call_ended)
        self.track(call)

    def stopping(self, handler: HandlerCall, call: asyncio.Task[None], turn: str) -> None:
        """A handler call ws_mode stopped (`HandlerCall.stop`), whose turn is over: given
        `Limits.abandon_handler_seconds` to end, then abandoned."""
        if call.done():
            return
        if call not in self._calls:
            self.track_call(handler, call, turn)
        if call not in self._timers:
            loop = asyncio.get_running_loop()
            grace = self.settings.limits.abandon_handler_seconds
            self._timers[call] = loop.call_later(grace, self._abandon, call)

    def _call_ended(self, call: asyncio.Task[None]) -> None:
        self._calls.pop(call, None)
        timer = self._timers.pop(call, None)
        if timer is not None:
            timer.cancel()

    def _abandon(self, call: asyncio.Task[None]) -> None:
        """A stopped handler call is still running: stop waiting for it, let go of what it
        held; said once in the log and counted (`handlers_abandoned`)."""
        found = self._calls.pop(call, None)
        timer = self._timers.pop(call, None)
        if timer is not None:
            timer.cancel()
        self._tasks.discard(call)
        if found is None or call.done():
            return
        handler, turn = found
        handler.abandon()
        call.add_done_callback(_quietly)
        self.settings.stats.handlers_abandoned += 1
        logger.warning(
            "abandoned the handler at %s (%s): still running %g s after it was cancelled "
            "(Limits.abandon_handler_seconds); it ignores cancellation, what it sends from "
            "now on goes nowhere",
            handler.scope.get("path"),  # the handler_path the middleware was given
            turn,
            self.settings.limits.abandon_handler_seconds,
        )

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
        then cancel it; return once it has ended, or once the handler calls among it that
        ignore their cancellation are abandoned (`Limits.abandon_handler_seconds`).

        The connection's task may itself be cancelled (a server's shutdown timeout): then the
        work gets no grace, and is cancelled with it, never left pending on a loop about to
        close (Python's "Task was destroyed but it is pending!")."""
        if not self._tasks:
            return
        limits = self.settings.limits
        current = asyncio.current_task()
        cancelled = current is not None and current.cancelling() > 0
        grace = 0.0 if cancelled else limits.after_response_grace_seconds
        running = [task for task in self._tasks if task not in self._timers]
        try:
            if running:
                await asyncio.wait(running, timeout=grace)
        finally:
            for task in running:
                if task.done():
                    continue
                found = self._calls.get(task)
                if found is None:
                    task.cancel()
                else:
                    found[0].stop_now(task)
                    self.stopping(found[0], task, found[1])
            pending = [task for task in self._tasks if not task.done()]
            try:
                if pending:
                    await asyncio.wait(pending, timeout=limits.abandon_handler_seconds)
            finally:
                for task in list(self._timers):
                    self._abandon(task)
                for task in pending:
                    if not task.done() and task in self._tasks:
                        # Work of ws_mode's own (the `on_response` hook) that ignores its
                        # cancellation: no longer waited for either.
                        self._tasks.discard(task)
                        task.add_done_callback(_quietly)
                        logger.warning("post-response work ignored its cancellation")


def _quietly(task: asyncio.Task[None]) -> None:
    """An abandoned task ended: its outcome is read, so that nothing reports it unread."""
    if not task.cancelled():
        task.exception()


def _log_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, ClientGone):
        logger.error("work after a response failed", exc_info=error)
