"""The exceptions ws_mode raises to its users (`ws_mode._errors`): a bad setting raises
`ConfigError`, which callers may catch as a `ValueError` or, with every other error of
ws_mode's, as a `WSModeError`."""

from __future__ import annotations

from typing import Any

import pytest

from ws_mode import AuthenticationFailed, ConfigError, Limits, WebSocketModeMiddleware, WSModeError


async def app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("never called")


@pytest.mark.parametrize(
    "build",
    [
        lambda: WebSocketModeMiddleware(app, full_context="sometimes"),  # type: ignore[arg-type]
        lambda: WebSocketModeMiddleware(app, path="v1/responses"),
        lambda: Limits(max_connections=0),
        lambda: Limits(max_cached_bytes=1.5),  # type: ignore[arg-type]
    ],
    ids=["middleware-option", "middleware-path", "limits-bound", "limits-integer"],
)
def test_a_bad_setting_raises_config_error_caught_as_value_error_or_ws_mode_error(
    build: Any,
) -> None:
    with pytest.raises(ValueError, match="must") as as_value_error:
        build()
    assert isinstance(as_value_error.value, ConfigError)
    with pytest.raises(WSModeError):
        build()


def test_a_refused_handshake_is_a_ws_mode_error_too() -> None:
    # What an `authenticate` hook raises: one `except WSModeError` covers it as well.
    with pytest.raises(WSModeError):
        raise AuthenticationFailed("no key", status=403)
