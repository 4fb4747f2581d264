"""A real nginx for the tests, running the configuration docs/deployment.md gives.

`documented_block(heading)` reads a code block of the document as it stands; `nginx(upstream,
block)` runs it (its upstream and `listen` pointed at loopback, no TLS) in the foreground and
yields its origin. nginx is an OS package (Debian's `nginx-light` or `nginx`, which `.ci/run`
installs where it is missing); the project's test command does not install it, so the tests
that run it are marked `needs_nginx` and skip without it, saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.servers import free_port

DEPLOYMENT = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"
NGINX = shutil.which("nginx") or next(
    (path for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(path, os.X_OK)),
    None,
)
needs_nginx = pytest.mark.skipif(
    NGINX is None,
    reason="nginx is not installed (an OS package the test command does not install: "
    "apt-get install nginx-light)",
)
#: How long nginx may run, whatever happens to the test.
LIFETIME = 120.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def documented_block(
    heading: str = "## Reverse proxies", language: str = "nginx", *, document: Path = DEPLOYMENT
) -> str:
    """The first ``language`` code block under ``heading`` in ``document`` (docs/deployment.md
    unless told)."""
    text = document.read_text()
    section = text[text.index(heading + "\n") :]
    found = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found, f"no {language} block under {heading}"
    return found.group(1)


def with_upstream(block: str, upstream: str, ports: Sequence[int]) -> str:
    """``block`` with its ``upstream responses {...}`` replaced by ``upstream`` (another
    documented block), whose servers ``127.0.0.1:8000``, ``:8001``... are moved to
    ``ports``."""
    for number, port in enumerate(ports):
        documented = f" 127.0.0.1:{8000 + number}"
        assert documented in upstream, "the documented upstream changed"
        upstream = upstream.replace(documented, f" 127.0.0.1:{port}")
    replaced, count = re.subn(r"upstream responses \{.*?\n\}\n", upstream, block, flags=re.DOTALL)
    assert count == 1, "the documented block changed"
    return replaced


def nginx_config(block: str, *, upstream: str | None, port: int, prefix: Path) -> str:
    """A whole nginx.conf around the documented ``block``: its upstream at ``upstream``
    (``host:port``; None: as the block has it), its ``listen`` (``443 ssl``, or ``8080`` for a
    block without TLS) on 127.0.0.1:``port`` without TLS, one process in the foreground, every
    file under ``prefix``."""
    upstream_line = "    server 127.0.0.1:8000;"
    listen_line = "    listen 443 ssl;"
    # A block behind TLS (the client's side) or in front of replicas (plain HTTP, port 8080).
    tls = listen_line in block
    if not tls:
        listen_line = "    listen 8080;"
    assert listen_line in block, "the documented block changed"
    if upstream is not None:
        assert upstream_line in block, "the documented block changed"
        block = block.replace(upstream_line, f"    server {upstream};")
    block = block.replace(listen_line, f"    listen 127.0.0.1:{port};")
    # The certificate lines the reader fills in: no TLS here.
    certificates = re.compile(r"^    ssl_certificate(_key)? .*# FILL IN.*\n", re.MULTILINE)
    block, count = certificates.subn("", block)
    assert count == (2 if tls else 0), "the documented block changed"
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


@contextlib.contextmanager
def nginx(
    upstream_url: str | None, block: str | None = None, *, lifetime: float = LIFETIME
) -> Iterator[str]:
    """nginx with the documented configuration (or ``block``) in front of ``upstream_url``
    (None: the upstreams ``block`` names), on loopback; yields its ``http://127.0.0.1:PORT``.
    It is killed when the block exits, when the thread that started it ends, or after
    ``lifetime`` seconds."""
    assert NGINX is not None
    upstream = upstream_url.removeprefix("http://") if upstream_url is not None else None
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
        timer = threading.Timer(lifetime, process.kill)
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
