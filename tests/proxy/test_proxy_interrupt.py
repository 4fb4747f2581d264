"""`response.interrupt` through `ws_mode.proxy`: the middleware stops the proxy's handler call,
which closes the upstream request, so the upstream stops generating (its stream is listed as
cut short) while the client already has the interrupted response's end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import connect

from tests.proxy.test_proxy import KEY, _wait_aborted, proxied, upstream_process


@pytest.fixture(scope="module")
def storing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs: Path = tmp_path_factory.mktemp("interrupt-logs")
    with upstream_process("storing", logs, key=KEY) as origin:
        yield origin


def test_an_interrupt_closes_the_upstream_request(storing: str) -> None:
    with proxied(storing + "/v1") as base:
        url = base.replace("http", "ws") + "/v1/responses"
        with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            # ~5 s of events if nobody stopped it.
            ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hi",
                                "metadata": {"gap": "0.3"}}))  # fmt: skip
            created = json.loads(ws.recv(10))
            assert created["type"] == "response.created"
            target = created["response"]["id"]
            ws.send(json.dumps({"type": "response.interrupt", "response_id": target,
                                "mode": "discard_partial_items"}))  # fmt: skip
            kinds = []
            while not kinds or kinds[-1] != "response.incomplete":
                kinds.append(json.loads(ws.recv(10))["type"])
            assert kinds[0] == "response.interrupt.accepted"
            assert "response.completed" not in kinds
            _wait_aborted(storing, target)
