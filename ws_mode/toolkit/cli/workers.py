"""The worker processes of ``ws-mode serve --workers N``: uvicorn's supervisor, with workers that
drain before they stop.

uvicorn's :class:`~uvicorn.supervisors.Multiprocess` runs N workers on one listening socket,
replaces one that dies, and on SIGHUP replaces them one at a time (a new worker serves before
the old one gets SIGTERM): a rolling restart. Its workers are plain ``uvicorn.Server``\\ s, which
close every WebSocket with 1012 the moment they stop and cancel the turns running on them.

:class:`DrainingSupervisor` runs :class:`DrainingWorker`\\ s instead. A worker told to stop
first stops accepting, as every :class:`ws_mode.server.Server` does: the other workers share
the listening socket, so new connections go to them at once (a draining middleware would
refuse them with 503, which costs the client a retry). Then it drains as the ``Server`` does:
running turns finish (up to ``Limits.shutdown_grace_seconds``), sockets close with 1001, which
the openai SDK counts as recoverable, and the store writes under way land. Only then does
uvicorn's own shutdown run.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import uvicorn
from uvicorn.supervisors import multiprocess

from ws_mode.server import Server, find_middlewares

__all__ = ["START_SECONDS", "DrainingProcess", "DrainingSupervisor", "DrainingWorker"]

#: How long a new worker of a rolling restart may take to serve before uvicorn abandons the
#: restart (keeping the old workers). uvicorn allows ``timeout_worker_healthcheck`` (5 s), the
#: same bound as its pings; a worker imports the toolkit and connects its store before it
#: serves, which took up to 8 s on a busy 2-core host. The pings keep uvicorn's bound: a
#: worker that dies while a ping waits for its answer is replaced only once the bound is over.
START_SECONDS: Final = 30.0


class DrainingWorker(Server):
    """One worker's server: it stops accepting (closing its copy of the shared listening
    socket: :meth:`Server.stop_accepting`), then drains the middlewares of its app.

    The app is a factory's, built in the worker when uvicorn loads it, so the middlewares are
    found once the server has started."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config, middlewares=())

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.middlewares = find_middlewares(self.config.loaded_app)


class DrainingProcess(multiprocess.Process):
    """uvicorn's worker process, running a :class:`DrainingWorker`, given
    :data:`START_SECONDS` to start in a rolling restart. It is pickled into the new process
    (multiprocessing's spawn), which imports this module to rebuild it."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = DrainingWorker(self.config)
        return self._server

    def wait_until_ready(self, timeout: float, should_exit: threading.Event | None = None) -> bool:
        return super().wait_until_ready(max(timeout, START_SECONDS), should_exit)


class DrainingSupervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor (restarts, SIGHUP, SIGTTIN and SIGTTOU as uvicorn documents them),
    its workers :class:`DrainingProcess`\\ es."""

    def run(self) -> None:
        with _workers_made_as(DrainingProcess):
            super().run()


@contextmanager
def _workers_made_as(process_class: type[multiprocess.Process]) -> Iterator[None]:
    """uvicorn's supervisor makes each worker with its module's ``Process`` (at start, on a
    restart, on SIGHUP and SIGTTIN) and takes no other class: the name points at
    ``process_class`` while the supervisor runs, in this process only (nothing else here
    runs uvicorn's supervisor)."""
    original = multiprocess.Process
    if not issubclass(process_class, original):  # uvicorn renamed or replaced it: say so
        raise TypeError(f"{process_class.__name__} is not a {original.__qualname__}")
    setattr(multiprocess, "Process", process_class)  # noqa: B010 - a module's name, on purpose
    try:
        yield
    finally:
        setattr(multiprocess, "Process", original)  # noqa: B010
