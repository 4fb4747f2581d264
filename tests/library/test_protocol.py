"""The wire shapes `ws_mode._protocol` owns."""

from __future__ import annotations

import pytest

from ws_mode._protocol import error_type_for_status


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "invalid_request_error"),
        (429, "invalid_request_error"),
        (499, "invalid_request_error"),
        (500, "server_error"),
        (503, "server_error"),
    ],
)
def test_error_type_follows_the_status(status: int, kind: str) -> None:
    assert error_type_for_status(status) == kind
