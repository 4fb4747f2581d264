"""docs/operations.md's nginx snippet that keeps `/metrics` private, in the `server` block of
the nginx configuration docs/deployment.md gives (its upstream): `nginx -t` accepts it, and a
real nginx refuses `/metrics` and `/metrics/` to a client outside the allowed network while
`/v1/responses` still reaches the upstream."""

from __future__ import annotations

import re
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tests.nginx import NGINX, documented_block, needs_nginx, nginx, nginx_config
from tests.servers import free_port, serve
from tests.startup_apps import served

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
LOCATION = "    location /v1/responses {"


def with_metrics_snippet() -> str:
    """The deployment's nginx block with the operations' `/metrics` snippet beside its
    `location /v1/responses`."""
    text = OPERATIONS.read_text()
    section = text[text.index("**Keep `/metrics` private.**") :]
    found = re.search(r"```nginx\n(.*?)```", section, re.DOTALL)
    assert found, "no nginx block under 'Keep /metrics private'"
    block = documented_block()
    assert LOCATION in block, "the documented block changed"
    snippet = "".join(f"    {line}\n" for line in found.group(1).splitlines())
    return block.replace(LOCATION, snippet + LOCATION, 1)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            code: int = answer.status
            return code
    except urllib.error.HTTPError as refused:
        return refused.code


@needs_nginx
def test_nginx_accepts_the_metrics_snippet_in_the_deployment_configuration() -> None:
    assert NGINX is not None
    with tempfile.TemporaryDirectory(prefix="ws-mode-nginx-") as directory:
        prefix = Path(directory)
        config = prefix / "nginx.conf"
        config.write_text(
            nginx_config(
                with_metrics_snippet(), upstream="127.0.0.1:8000", port=free_port(), prefix=prefix
            )
        )
        tested = subprocess.run(
            [NGINX, "-t", "-p", str(prefix), "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert tested.returncode == 0, tested.stderr


@needs_nginx
def test_the_metrics_are_refused_outside_the_allowed_network_with_or_without_a_slash() -> None:
    with serve(served) as upstream, nginx(upstream, with_metrics_snippet()) as proxy:
        assert status(proxy + "/metrics") == 403  # loopback is outside 10.0.0.0/8
        assert status(proxy + "/metrics/") == 403
        assert status(proxy + "/v1/responses") == 405  # the app's answer to a GET: proxied
