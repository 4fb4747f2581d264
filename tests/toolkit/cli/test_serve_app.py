"""``ws-mode serve --app MODULE:ATTRIBUTE``: your own app, run the way the reference server is.

The README's FastAPI example (examples/fastapi_app.py, no store) under real uvicorn workers of
the command, restarted worker by worker (SIGHUP) while clients of examples/client_resume.py hold
conversations: every conversation ends with the answer its whole history gives, and no upgrade
is answered 426 (each stopping worker stops accepting first). An app factory (``--factory``)
whose middleware takes small messages gets a frame limit matched to them: a message a little
over ``Limits.max_message_bytes`` reaches the middleware and gets its error event, one over the
margin is refused by uvicorn (close 1009), where the reference server's limit would let it
through. What the command refuses, it says in one line.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from tests.rolling import converse
from tests.serve_workers import replaced, wait_for_workers
from tests.servers import ROOT, ws_mode_serve
from ws_mode.testing._client import SocketClosed, connect
from ws_mode.testing._loopback import WS_MARGIN
from ws_mode.toolkit.cli import main

TURNS = 5
#: The message limit of the factory's middleware.
SMALL = 256 * 1024

FACTORY = f"""
from fastapi import FastAPI

from examples.fastapi_app import create
from ws_mode import Limits, WebSocketModeMiddleware


def make_app() -> FastAPI:
    app = FastAPI()
    app.post("/v1/responses")(create)
    app.add_middleware(WebSocketModeMiddleware, limits=Limits(max_message_bytes={SMALL}))
    return app


plain = FastAPI()
"""


def test_a_rolling_restart_of_your_app_under_workers_loses_no_conversation(
    tmp_path: Path,
) -> None:
    app = ("--app", "examples.fastapi_app:app", "--app-dir", str(ROOT))
    with ws_mode_serve(*app, "--workers", "2", cwd=tmp_path) as served:
        pid = served.process.pid
        assert "examples.fastapi_app:app, 2 workers" in served.banner
        workers = wait_for_workers(pid, 2)

        def roll() -> None:
            os.kill(pid, signal.SIGHUP)
            replaced(pid, workers, timeout=120)

        rolled = converse(served.origin, clients=8, turns=TURNS, roll=roll)
    assert not rolled.lost, rolled.lost
    assert rolled.refused_426 == 0, rolled.causes
    assert rolled.resends, rolled.figure()  # the roll closed their sockets: they came back
    for client in rolled.clients:
        assert client.conversations, rolled.figure()
        for conversation in client.conversations:
            # The handler saw the whole history, whichever worker answered: without a store
            # the client sent it again after each close (previous_response_not_found).
            seen = len(conversation.history)  # the last question included
            assert conversation.final.output_text == f"I have seen {seen} item(s)."
            assert seen == 2 * TURNS - 1
    print(rolled.figure())


def create(size: int) -> dict[str, object]:
    return {"type": "response.create", "model": "m", "input": "x" * size}


def test_an_app_factory_gets_a_frame_limit_matched_to_its_middleware(tmp_path: Path) -> None:
    (tmp_path / "my_app.py").write_text(FACTORY)
    flags = ("--app", "my_app:make_app", "--factory", "--app-dir", str(tmp_path))
    with ws_mode_serve(*flags, cwd=ROOT) as served:
        with connect(served.origin) as socket:
            socket.send(create(SMALL // 2))
            assert socket.receive_turn(timeout=30)[-1]["type"] == "response.completed"
            socket.send(create(SMALL + WS_MARGIN // 2))  # over the middleware's limit
            refused = socket.receive(timeout=30)
            assert refused["type"] == "error"
            assert refused["error"]["code"] == "message_too_large"
        with connect(served.origin) as socket:
            socket.send(create(SMALL + 2 * WS_MARGIN))  # over uvicorn's: the limit plus margin
            with pytest.raises(SocketClosed):
                socket.receive(timeout=30)
            assert socket.connection.close_code == 1009


def test_what_it_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_app.py").write_text(textwrap.dedent(FACTORY))
    directory = ("--app-dir", str(tmp_path))
    assert main(["serve", "--app", "my_app:plain", *directory]) == 1
    assert "--app my_app:plain: no WebSocketModeMiddleware found in it" in capsys.readouterr().err
    assert main(["serve", "--app", "my_app:missing", *directory]) == 1
    assert 'Attribute "missing" not found in module "my_app"' in capsys.readouterr().err
    assert main(["serve", "--app", "my_app:make_app", "--tool-calls", "1", *directory]) == 2
    assert "--tool-calls: for the reference server only" in capsys.readouterr().err
    assert main(["serve", "--factory"]) == 2
    assert "--factory goes with --app" in capsys.readouterr().err
