"""``--metrics PATH`` of ``ws-mode serve`` and ``ws-mode proxy``: Prometheus metrics beside the
API, scraped over HTTP from the real command after real socket turns."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ws_mode_proxy, ws_mode_serve
from ws_mode.testing._client import connect
from ws_mode.testing._loopback import ServerThread
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.cli.metrics import metrics_banner, metrics_path, serve_metrics
from ws_mode.toolkit.reference import create_app


def scrape(origin: str, path: str = "/metrics") -> dict[str, dict[str, float]]:
    """``GET path`` over HTTP: each sample by name, then by its labels other than
    ``middleware`` (``code=...``, ``le=...``, or ""), which must be ``default``: a command
    serves one middleware."""
    answer = httpx.get(f"{origin}{path}", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if not sample.name.startswith("ws_mode_"):
                continue  # prometheus_client's own process metrics
            assert labels.pop("middleware") == "default", sample
            rest = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
            samples.setdefault(sample.name, {})[rest] = sample.value
    return samples


def chain(origin: str) -> str:
    """A turn on one socket, its continuation on another (the parent from the store); the id
    of the first response."""
    with connect(origin) as first:
        first.send({"type": "response.create", "model": "m", "input": "hi"})
        response: dict[str, Any] = first.receive_turn(timeout=10)[-1]["response"]
    call = response["output"][0]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    with connect(origin) as second:
        second.send(
            {"type": "response.create", "model": "m", "input": [answer],
             "previous_response_id": response["id"]}
        )  # fmt: skip
        event = second.receive_turn(timeout=10)[-1]
    assert event["type"] == "response.completed", event
    return str(response["id"])


def test_serve_metrics_are_scraped_beside_the_api(tmp_path: Path) -> None:
    with ws_mode_serve("--store", "memory", "--metrics", "/metrics", cwd=tmp_path) as served:
        assert f"Prometheus metrics at {served.origin}/metrics" in served.banner
        before = scrape(served.origin)
        chain(served.origin)
        with connect(served.origin) as socket:
            socket.send("not json")
            assert socket.receive(timeout=10)["error"]["code"] == "invalid_json"
        after = scrape(served.origin)
        # The API is where it was.
        plain = httpx.post(f"{served.origin}/v1/responses", json={"input": "hi"}, timeout=10)
        assert plain.json()["object"] == "response"
    assert before["ws_mode_turns_total"] == {"": 0}
    assert before["ws_mode_store_writes_total"] == {"": 0}
    assert after["ws_mode_connections_total"][""] == 3
    assert after["ws_mode_turns_total"][""] == 2
    assert after["ws_mode_store_writes_total"][""] >= 2
    assert after["ws_mode_store_hydrations_total"][""] == 1
    assert after["ws_mode_store_failures_total"][""] == 0
    assert after["ws_mode_errors_total"] == {"code=invalid_json": 1}
    assert after["ws_mode_turn_seconds_count"][""] == 2
    assert after["ws_mode_turn_seconds_bucket"]["le=+Inf"] == 2


def test_serve_without_metrics_has_no_metrics_path(tmp_path: Path) -> None:
    with ws_mode_serve(cwd=tmp_path) as served:
        assert "Prometheus" not in served.banner
        assert httpx.get(f"{served.origin}/metrics", timeout=10).status_code == 404


def test_proxy_metrics_are_scraped_beside_the_api() -> None:
    with ServerThread(create_app()) as upstream:
        flags = ("--upstream", f"{upstream}/v1", "--store", "memory", "--store-scope", "shared")
        with ws_mode_proxy(*flags, "--metrics", "/internal/metrics") as proxy:
            assert f"Prometheus metrics at {proxy.origin}/internal/metrics" in proxy.banner
            chain(proxy.origin)
            after = scrape(proxy.origin, "/internal/metrics")
            assert httpx.get(f"{proxy.origin}/metrics", timeout=10).status_code == 404
    assert after["ws_mode_turns_total"][""] == 2
    assert after["ws_mode_store_writes_total"][""] >= 2
    assert after["ws_mode_store_hydrations_total"][""] == 1
    assert after["ws_mode_connections_open"][""] == 0


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["serve", "--metrics", "metrics"], "expected a path such as /metrics"),
        (["serve", "--metrics", "/v1/responses"], "is the API's own path"),
        (["proxy", "--upstream", "http://127.0.0.1:9/v1", "--metrics", "/x?y"], "expected a path"),
        (
            ["serve", "--workers", "2", "--store", "redis://127.0.0.1:9/0", "--metrics", "/m"],
            "--metrics cannot go with --workers 2",
        ),
    ],
)
def test_a_bad_metrics_flag_is_a_usage_error(
    flags: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(flags) == 2
    assert complaint in capsys.readouterr().err


def test_metrics_need_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(argparse.ArgumentTypeError, match="pip install prometheus-client"):
        metrics_path("/metrics")


async def app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app, never called."""


def test_without_the_flag_nothing_changes() -> None:
    assert serve_metrics(app, None) is app

    def banner(origin: str) -> str:
        return f"at {origin}"

    assert metrics_banner(banner, None) is banner
    assert metrics_banner(banner, "/m")("h:1") == "at h:1; Prometheus metrics at http://h:1/m"
