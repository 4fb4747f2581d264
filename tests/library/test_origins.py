"""OriginPolicy: which browser origins may open a socket."""

from __future__ import annotations

import pytest

from ws_mode import ConfigError
from ws_mode._origins import OriginPolicy


def scope(origin: str | None, host: str = "api.example.com") -> dict[str, object]:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "websocket", "headers": headers}


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, "api.example.com", True),  # no Origin: not a browser
        ("https://api.example.com", "api.example.com", True),  # the server's own origin
        ("https://api.example.com:443", "api.example.com", True),
        ("http://api.example.com", "api.example.com:80", True),
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://127.0.0.1:8001", "127.0.0.1:8000", False),
        ("https://evil.example", "api.example.com", False),
        ("https://api.example.com.evil.example", "api.example.com", False),
        ("null", "api.example.com", False),
    ],
)
def test_default_allows_only_the_servers_own_origin(
    origin: str | None, host: str, allowed: bool
) -> None:
    assert OriginPolicy(()).allows(scope(origin, host)) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://app.example.com", True),
        ("HTTPS://App.Example.Com", True),
        ("http://app.example.com", False),  # another scheme is another origin
        ("https://eu.trusted.example", True),
        ("https://a.b.trusted.example", True),
        ("https://trusted.example", False),  # the pattern names subdomains only
        ("https://nottrusted.example", False),
        ("http://eu.trusted.example", False),
        ("null", True),
    ],
)
def test_listed_origins_and_patterns(origin: str, allowed: bool) -> None:
    policy = OriginPolicy(["https://app.example.com", "https://*.trusted.example", "null"])
    assert policy.allows(scope(origin)) is allowed


def test_a_star_allows_every_origin() -> None:
    assert OriginPolicy(["*"]).allows(scope("https://anything.example"))


@pytest.mark.parametrize(
    "bad", ["app.example.com", "https://app.example.com/path", "ftp://x", "https://", "*", 5]
)
def test_bad_settings_are_refused(bad: object) -> None:
    entries = bad if bad == "*" else [bad]  # a bare string is not a sequence of origins
    with pytest.raises(ConfigError, match="allowed_origins"):
        OriginPolicy(entries)  # type: ignore[arg-type]
