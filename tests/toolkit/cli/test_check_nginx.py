"""``ws-mode check`` through a real nginx running the configuration docs/deployment.md gives.

The nginx block under "Reverse proxies" is read from the document as it stands, its upstream
and ``listen`` pointed at loopback (no TLS here), and run by the test. Every check passes
through it; with its two timeouts cut to 2 s and uvicorn pinging every 4 s, the idle check
fails and its hint gives both numbers; behind it, uvicorn's default frame limit is found (its
close 1009 mostly reaches the client as a dropped connection through nginx). The ingress-nginx
annotations the document gives are checked against the directives of the block the tests run.

nginx is an OS package (Debian's ``nginx-light`` or ``nginx``), which the project's test
command does not install: without it the tests that run it skip, saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from tests.toolkit.cli.checks import flat, row, run
from ws_mode.testing._loopback import ServerThread, ws_max_size
from ws_mode.toolkit.cli.serve import build_app

DEPLOYMENT = Path(__file__).resolve().parents[3] / "docs" / "deployment.md"
NGINX = shutil.which("nginx") or next(
    (path for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(path, os.X_OK)),
    None,
)
needs_nginx = pytest.mark.skipif(
    NGINX is None,
    reason="nginx is not installed (an OS package the test command does not install: "
    "apt-get install nginx-light)",
)
#: uvicorn's own default frame limit (16 MiB), as a server started without --ws-max-size has.
UVICORN_WS_MAX_SIZE: int = inspect.signature(uvicorn.Config).parameters["ws_max_size"].default
#: How long nginx may run, whatever happens to the test.
LIFETIME = 120.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def documented_block(heading: str = "## Reverse proxies", language: str = "nginx") -> str:
    """The first ``language`` code block under ``heading`` in docs/deployment.md."""
    text = DEPLOYMENT.read_text()
    section = text[text.index(heading + "\n") :]
    found = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found, f"no {language} block under {heading}"
    return found.group(1)


def nginx_config(block: str, *, upstream: str, port: int, prefix: Path) -> str:
    """A whole nginx.conf around the documented ``block``: its upstream at ``upstream``
    (``host:port``), its ``listen`` on 127.0.0.1:``port`` without TLS, one process in the
    foreground, every file under ``prefix``."""
    upstream_line = "    server 127.0.0.1:8000;"
    listen_line = "    listen 443 ssl;"
    assert upstream_line in block, "the documented block changed"
    assert listen_line in block, "the documented block changed"
    block = block.replace(upstream_line, f"    server {upstream};")
    block = block.replace(listen_line, f"    listen 127.0.0.1:{port};")
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""daemon off;
master_process off;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temp}
{block}
}}
"""


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    """Between fork and exec: SIGKILL nginx when the thread that started it ends."""
    if _LIBC is None or _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:
        os._exit(127)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def nginx(upstream_url: str, block: str | None = None) -> Iterator[str]:
    """nginx with the documented configuration (or ``block``) in front of ``upstream_url``, on
    loopback; yields its ``http://127.0.0.1:PORT``. It is killed when the block exits, when
    the thread that started it ends, or after :data:`LIFETIME` seconds."""
    assert NGINX is not None
    upstream = upstream_url.removeprefix("http://")
    with tempfile.TemporaryDirectory(prefix="ws-mode-nginx-") as directory:
        prefix = Path(directory)
        port = free_port()
        config = prefix / "nginx.conf"
        config.write_text(
            nginx_config(block or documented_block(), upstream=upstream, port=port, prefix=prefix)
        )
        parent = os.getpid()
        process = subprocess.Popen(
            [NGINX, "-p", str(prefix), "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _die_with_parent(parent),
        )
        timer = threading.Timer(LIFETIME, process.kill)
        timer.daemon = True
        timer.start()
        try:
            _wait_listening(port, process, prefix / "error.log")
            yield f"http://127.0.0.1:{port}"
        finally:
            timer.cancel()
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.02)
    said = log.read_text() if log.exists() else ""
    raise RuntimeError(f"nginx did not start on port {port}: {said[-2000:]}")


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
