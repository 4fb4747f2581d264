"""``ws-mode serve --app`` with an app whose middleware was given a bad option: one line on
stderr, in the words uvicorn prints when the same app's startup fails, and exit status 1; no
traceback."""

from __future__ import annotations

import pytest

from tests.library.test_startup import start_fails
from ws_mode.toolkit.cli import main


def serve_fails(capsys: pytest.CaptureFixture[str], target: str) -> str:
    """What ``ws-mode serve --app tests.startup_apps:<target>`` says: its one line."""
    status = main(["serve", "--app", f"tests.startup_apps:{target}", "--port", "0"])
    out, err = capsys.readouterr()
    assert status == 1
    assert "Traceback" not in out + err
    (line,) = err.splitlines()
    return line


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("bad_value", "steering must be True or False, got 'yes'"),
        ("unknown_option", "no option 'steerng'"),
        ("store_without_authenticate", "store= needs to know whose responses are whose"),
    ],
)
def test_a_bad_option_is_one_line(
    capsys: pytest.CaptureFixture[str], target: str, said: str
) -> None:
    line = serve_fails(capsys, target)
    assert line.startswith("ws-mode serve: error: WebSocketModeMiddleware: ")
    assert said in line


def test_the_line_says_what_uvicorn_says(capsys: pytest.CaptureFixture[str]) -> None:
    (under_uvicorn,) = start_fails("store_without_authenticate")
    words = under_uvicorn.split("WebSocketModeMiddleware: ", 1)[1]
    assert serve_fails(capsys, "store_without_authenticate").endswith(
        "WebSocketModeMiddleware: " + words
    )


def test_a_malformed_store_url_in_the_app_is_one_line_without_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["serve", "--app", "tests.bad_store_url_app:app", "--port", "0"])
    out, err = capsys.readouterr()
    assert status == 1
    assert "Traceback" not in out + err
    (line,) = err.splitlines()
    assert line.startswith("ws-mode serve: error: --app tests.bad_store_url_app:app: RedisStore: ")
    assert "notaport" in line
    assert "secret" not in line
