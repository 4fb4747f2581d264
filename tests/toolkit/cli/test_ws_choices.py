"""``--ws``: the WebSocket implementations ``ws-mode serve`` and ``ws-mode proxy`` offer, and
what the proxy leaves unimported."""

from __future__ import annotations

from tests.fresh_python import fresh_output
from ws_mode import WebSocketModeMiddleware
from ws_mode.server import BatchingWebSocketProtocol
from ws_mode.toolkit.cli.common import WS_IMPLEMENTATIONS
from ws_mode.toolkit.reference import create_app


def test_every_ws_choice_is_a_protocol_uvicorn_loads() -> None:
    import uvicorn

    loaded = {}
    for name, ws in WS_IMPLEMENTATIONS.items():
        config = uvicorn.Config(WebSocketModeMiddleware(create_app()), ws=ws)
        config.load()
        loaded[name] = config.ws_protocol_class
    assert loaded["batched"] is BatchingWebSocketProtocol
    assert all(protocol is not None for protocol in loaded.values())


def test_the_proxy_imports_its_servers_without_what_it_never_runs() -> None:
    # In a fresh interpreter: httpx without its command line client (rich), uvicorn without its
    # reload watcher, both working.
    code = (
        "import sys\n"
        "from ws_mode.toolkit.cli.proxy import import_servers_lean\n"
        "import_servers_lean()\n"
        "import httpx, uvicorn\n"
        "httpx.Timeout(1.0)\n"
        "from uvicorn.supervisors import ChangeReload\n"
        "loaded = [m for m in ('rich', 'pygments', 'watchfiles') if sys.modules.get(m)]\n"
        "print(loaded, ChangeReload.__name__)\n"
    )
    assert fresh_output(code) == ["[]", "StatReload"]
