"""The servers the compliance cases run against, each on loopback under uvicorn:

- ``serve``: the reference server behind `WebSocketModeMiddleware`, built as ``ws-mode serve``
  builds it (`ws_mode.toolkit.cli.serve.build_app`, the whole history sent every turn);
- ``serve-on-miss``: the same with ``full_context="on_miss"`` (continuations reach the
  reference with only their new items and resume from the cached Turn);
- ``proxy``: ``ws-mode proxy``'s app (`create_proxy`, wrapped by the middleware) in front of
  the plain-HTTP reference server, served on a socket of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy
from ws_mode.toolkit.cli.serve import build_app
from ws_mode.toolkit.reference import create_app

TARGETS = ("serve", "serve-on-miss", "proxy")


@contextlib.contextmanager
def _proxy() -> Iterator[str]:
    with serve(create_app()) as upstream:
        proxy = WebSocketModeMiddleware(create_proxy(upstream + "/v1"))
        with serve(proxy) as base:
            yield base


@pytest.fixture(scope="session")
def bases() -> Iterator[dict[str, str]]:
    """The base URL of every target, started once for the session."""
    with contextlib.ExitStack() as stack:
        yield {
            "serve": stack.enter_context(serve(build_app())),
            "serve-on-miss": stack.enter_context(serve(build_app(full_context="on_miss"))),
            "proxy": stack.enter_context(_proxy()),
        }


@pytest.fixture(params=TARGETS)
def base(request: pytest.FixtureRequest, bases: dict[str, str]) -> str:
    """The base URL of one target (every case runs against each)."""
    url: str = bases[request.param]
    return url
