"""Every `Limits` field a serving command exposes reaches the middleware's `Limits`, the same for
`ws-mode serve` and `ws-mode proxy` (the flags are defined once, in `cli/common.py`).

The server is not started: `run_server` is replaced by one that keeps what it was given.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.cli import proxy as proxy_command
from ws_mode.toolkit.cli import serve as serve_command

#: Each flag, the `Limits` field it sets, a value to pass and the value the field gets.
LIMIT_FLAGS = [("--max-connection-seconds", "max_connection_seconds", "7.5", 7.5)]
COMMANDS = {
    "serve": (serve_command, []),
    "proxy": (proxy_command, ["--upstream", "http://127.0.0.1:9/v1"]),
}


def served(monkeypatch: pytest.MonkeyPatch, command: str, *flags: str) -> dict[str, Any]:
    """What `ws-mode COMMAND FLAGS` would serve: the app and the limits given to uvicorn."""
    module, required = COMMANDS[command]
    kept: dict[str, Any] = {}

    def keep(app: Any, args: argparse.Namespace, limits: Limits, *_: Any, **__: Any) -> None:
        kept.update(app=app, limits=limits)

    monkeypatch.setattr(module, "run_server", keep)
    assert main([command, *required, *flags]) == 0
    return kept


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("flag", "field", "text", "value"), LIMIT_FLAGS)
def test_each_limit_flag_reaches_the_middleware(
    monkeypatch: pytest.MonkeyPatch, command: str, flag: str, field: str, text: str, value: Any
) -> None:
    kept = served(monkeypatch, command, flag, text)
    app = kept["app"]
    assert isinstance(app, WebSocketModeMiddleware)
    assert getattr(app.settings.limits, field) == value
    assert getattr(kept["limits"], field) == value  # uvicorn's settings follow them too


@pytest.mark.parametrize("command", COMMANDS)
def test_without_the_flags_the_limits_are_the_defaults(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    app = served(monkeypatch, command)["app"]
    for _flag, field, _text, _value in LIMIT_FLAGS:
        assert getattr(app.settings.limits, field) == getattr(Limits(), field)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_lifetime_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _module, required = COMMANDS[command]
    assert main([command, *required, "--max-connection-seconds", "0"]) == 2
    assert "--max-connection-seconds" in capsys.readouterr().err


def test_the_proxy_asks_the_upstream_for_handshake_headers_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = served(monkeypatch, "proxy")["app"].settings.handshake_headers
    assert hook is not None
    assert hook.__name__ == "handshake_headers"
    app = served(monkeypatch, "proxy", "--no-upstream-handshake")["app"]
    assert app.settings.handshake_headers is None


def test_the_table_lists_every_limit_flag_of_both_commands() -> None:
    from dataclasses import fields

    from ws_mode.toolkit.cli import build_parser

    limit_fields = {field.name for field in fields(Limits)}
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    for command in COMMANDS:
        parser = commands.choices[command]
        exposed = {
            (action.option_strings[0], action.dest)
            for action in parser._actions
            if action.dest in limit_fields
        }
        assert exposed == {(flag, field) for flag, field, _text, _value in LIMIT_FLAGS}, command
