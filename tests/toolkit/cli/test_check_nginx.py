"""``ws-mode check`` through a real nginx running the configuration docs/deployment.md gives.

The nginx block under "Reverse proxies" is read from the document as it stands, its upstream
and ``listen`` pointed at loopback (no TLS here), and run by the test. Every check passes
through it; with its two timeouts cut to 2 s and uvicorn pinging every 4 s, the idle check
fails and its hint gives both numbers; behind it, uvicorn's default frame limit is found (its
close 1009 mostly reaches the client as a dropped connection through nginx). The ingress-nginx
annotations the document gives are checked against the directives of the block the tests run.

nginx is an OS package (Debian's ``nginx-light`` or ``nginx``): tests/nginx.py runs it, and the
tests skip where it is not installed.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator

import pytest
import uvicorn

from tests.nginx import LIFETIME, documented_block, needs_nginx, nginx
from tests.toolkit.cli.checks import flat, row, run
from ws_mode.testing._loopback import ServerThread, ws_max_size
from ws_mode.toolkit.cli.serve import build_app

#: uvicorn's own default frame limit (16 MiB), as a server started without --ws-max-size has.
UVICORN_WS_MAX_SIZE: int = inspect.signature(uvicorn.Config).parameters["ws_max_size"].default


@contextlib.contextmanager
def uvicorn_app(
    *, ws_max_size_bytes: int | None = None, ping_seconds: float | None = None
) -> Iterator[str]:
    """``ws-mode serve``'s app under uvicorn on loopback, with that frame limit (default:
    above ``max_message_bytes``) and ping interval (None: no pings)."""
    server = ServerThread(
        build_app(),
        ws_max_size=ws_max_size_bytes or ws_max_size(),
        lifetime=LIFETIME,
        name="nginx-upstream",
        options={"ws_ping_interval": ping_seconds, "ws_ping_timeout": 20.0},
    )
    with server as url:
        yield url


@needs_nginx
def test_every_check_passes_through_the_documented_nginx(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with uvicorn_app(ping_seconds=20.0) as upstream, nginx(upstream) as proxied:
        status, out, rows, _ = run(
            capsys, proxied + "/v1", "--idle", "3", "--max-probe-bytes", "8MiB", "--timeout", "20"
        )
    assert status == 0, out
    assert rows == dict.fromkeys(rows, "ok"), out
    assert len(rows) == 8
    assert "every size up to 8388608 B got through" in row(out, "largest message")


@needs_nginx
def test_uvicorns_default_frame_limit_is_found_through_nginx(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with uvicorn_app(ws_max_size_bytes=UVICORN_WS_MAX_SIZE) as upstream, nginx(upstream) as proxied:
        status, out, rows, err = run(
            capsys, proxied, "--idle", "0", "--min-probe-bytes", "8MiB", "--max-probe-bytes",
            "32MiB",
        )  # fmt: skip
    assert status == 1, out
    assert rows["largest message"] == "FAILED"
    line = row(out, "largest message")
    assert "16.00 MiB (16777216 B) gets through" in line
    # uvicorn closes with 1009; nginx, which stops relaying when uvicorn stops reading, mostly
    # drops the connection instead, and the hint says so.
    assert re.search(r"close 1009 \(message too big\)|the connection dropped", line), line
    hint = flat(out)
    assert "16.00 MiB is the default limit of uvicorn (--ws-max-size)" in hint
    if "dropped" in line:
        assert "behind nginx the ASGI server's close 1009 arrives as a dropped connection" in hint
    assert "EOFError" not in err


@needs_nginx
def test_nginx_timeouts_below_uvicorns_ping_interval_are_named_with_both_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    block = documented_block()
    for directive in ("proxy_read_timeout", "proxy_send_timeout"):
        block, changed = re.subn(rf"{directive} \d+s;", f"{directive} 2s;", block)
        assert changed == 1, directive
    with uvicorn_app(ping_seconds=4.0) as upstream, nginx(upstream, block) as proxied:
        status, out, rows, err = run(capsys, proxied, "--idle", "8", "--max-probe-bytes", "0")
    assert status == 1, out
    assert rows["idle socket"] == "FAILED"
    line = row(out, "idle socket")
    found = re.search(r"closed after (\d+\.\d) s .*first ping comes (\d+\.\d) s after", line)
    assert found, line
    closed_after, first_ping = float(found.group(1)), float(found.group(2))
    assert closed_after < first_ping
    hint = flat(out)
    assert f"its first ping comes after {first_ping:.1f} s" in hint
    assert f"idle for {closed_after:.1f} s" in hint
    assert f"ping interval below {closed_after:.1f} s" in hint
    assert "idle socket: waiting 8 s on a socket with nothing sent" in err
    assert "timing the server's pings" in err


#: ingress-nginx's annotations (nginx.ingress.kubernetes.io/NAME) and the nginx directive
#: each one sets.
ANNOTATION_DIRECTIVES = {
    "proxy-read-timeout": "proxy_read_timeout",
    "proxy-send-timeout": "proxy_send_timeout",
    "proxy-body-size": "client_max_body_size",
    "proxy-buffering": "proxy_buffering",
    "proxy-http-version": "proxy_http_version",
}


def test_the_ingress_annotations_match_the_nginx_block_the_tests_run() -> None:
    manifest = documented_block("### Kubernetes: ingress-nginx", "yaml")
    annotations = dict(
        re.findall(r"nginx\.ingress\.kubernetes\.io/([a-z-]+):\s*\"([^\"]*)\"", manifest)
    )
    assert set(ANNOTATION_DIRECTIVES) <= set(annotations), annotations
    block = documented_block()
    for annotation, directive in ANNOTATION_DIRECTIVES.items():
        found = re.search(rf"^\s*{directive} (\S+);", block, re.MULTILINE)
        assert found, directive
        # ingress-nginx takes timeouts in bare seconds; nginx writes them with a unit.
        assert found.group(1).removesuffix("s") == annotations[annotation].removesuffix("s"), (
            annotation,
            directive,
        )
