"""Smoke tests through real routers: `ws-mode proxy` (`create_proxy` under the middleware) in
front of a router in front of four simulated replicas, each with a real block-hash prefix cache
reporting honest `cached_tokens` (`ws_mode/toolkit/fleet.py`). The routers, each as
docs/fleet.md configures it:

- vLLM's (`vllm-router --policy consistent_hash`), which hashes `x-session-id` when a request has
  one and the whole request otherwise;
- SGLang's (`smg launch --policy manual`), which routes by `x-smg-routing-key` when a request has
  one and to a worker at random otherwise: the proxy puts the key in both headers
  (`conversation_key_headers=("x-session-id", "x-smg-routing-key")`);
- nginx (`hash` on `x-session-id`, consistent; a request without it spread at random), the
  configuration docs/fleet.md gives, read from the page.

A few conversations of several turns over real sockets (the kit's `websockets` client), the
same script three times: through one replica alone (the ideal: every continuation finds its
context on the replica that served the turn before), through the router with the conversation
key, and through the router with the key off. The share of the continuations' prompt tokens
found cached, as the usage the clients received reports it, is compared as ratios. A router's
test is skipped only where its binary cannot be found (the `test` extra installs both routers;
nginx is an OS package, see tests/nginx.py).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.nginx import NGINX, documented_block, nginx
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy
from ws_mode.testing._client import connect
from ws_mode.toolkit.fleet import MODEL, ROUTERS, Replica, replica_app, router, router_binary

REPLICAS = 4
CONVERSATIONS = 6
TURNS = 6
FLEET = Path(__file__).resolve().parents[2] / "docs" / "fleet.md"
#: What each router is installed as, and the headers the proxy puts the key in for it.
KEY_HEADERS = {
    "vllm-router": ("x-session-id",),
    "sglang-router": ("x-session-id", "x-smg-routing-key"),
    "nginx": ("x-session-id",),
}


def installed(kind: str) -> bool:
    return NGINX is not None if kind == "nginx" else router_binary(kind) is not None


@contextlib.contextmanager
def in_front(kind: str, urls: list[str]) -> Iterator[str]:
    """`kind` (a router of `ROUTERS`, or nginx as docs/fleet.md configures it) in front of
    `urls`; its base URL."""
    if kind in ROUTERS:
        with router(kind, urls) as base:
            yield base
        return
    block = documented_block("## A tested configuration: nginx", document=FLEET)
    for number, url in enumerate(urls):
        documented = f"server 127.0.0.1:{8000 + number};"
        assert documented in block, "the documented block changed"
        block = block.replace(documented, f"server {url.removeprefix('http://')};")
    assert not re.search(r"server 127\.0\.0\.1:800\d;", block), "more replicas documented"
    with nginx(None, block) as base:
        yield base


@pytest.fixture(scope="module", params=list(KEY_HEADERS))
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[Replica], list[str], str]]:
    """Four replicas on loopback (uvicorn threads), their URLs and the router's in front."""
    kind: str = request.param
    if not installed(kind):
        pytest.skip(f"{kind} is not installed")
    replicas = [Replica(f"replica-{n}") for n in range(REPLICAS)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve(replica_app(replica))) for replica in replicas]
        yield kind, replicas, urls, stack.enter_context(in_front(kind, urls))


def words(count: int) -> str:
    return " ".join(secrets.token_hex(3) for _ in range(count))


def converse(proxy_url: str) -> list[dict[str, Any]]:
    """`CONVERSATIONS` conversations of `TURNS` turns, one socket each, in turn; the usage of
    every continuation (the first turns' cannot hit: each conversation's prompt is its own)."""
    continuations: list[dict[str, Any]] = []
    for _ in range(CONVERSATIONS):
        with connect(proxy_url) as ws:
            chat = Chat(ws)
            chat.turn()
            continuations += [chat.turn() for _turn in range(TURNS - 1)]
    return continuations


def cached_share(usages: list[dict[str, Any]]) -> float:
    """The share of prompt tokens found cached."""
    cached = sum(usage["input_tokens_details"]["cached_tokens"] for usage in usages)
    return cached / sum(usage["input_tokens"] for usage in usages)


def through_proxy(upstream: str, **options: Any) -> tuple[float, WebSocketModeMiddleware]:
    """The conversations through `ws-mode proxy` to `upstream`: the continuations' cached
    share, and the middleware (its stats)."""
    middleware = WebSocketModeMiddleware(create_proxy(upstream + "/v1"), **options)
    with serve(middleware, lifespan="on") as proxy_url:
        return cached_share(converse(proxy_url)), middleware


def test_the_conversation_key_keeps_continuations_on_the_replica_holding_their_prefix(
    fleet: tuple[str, list[Replica], list[str], str],
) -> None:
    kind, replicas, urls, front = fleet
    headers = KEY_HEADERS[kind]
    ideal, _ = through_proxy(urls[0])  # one replica serves them all
    for replica in replicas:
        replica.served.clear()
    keyed, middleware = through_proxy(front, conversation_key_headers=headers)
    unkeyed, _ = through_proxy(front, conversation_key_headers=None)
    # With the key, every continuation reaches the replica holding its conversation: the
    # one-replica ideal. Without it the router hashes the whole request, which changes every
    # turn, or picks a replica at random: continuations land anywhere, most on a replica that
    # holds none of their prefix.
    assert ideal > 0.5
    assert keyed >= 0.95 * ideal, (ideal, keyed, unkeyed)
    assert unkeyed < 0.8 * ideal, (ideal, keyed, unkeyed)
    # The conversations were spread over the replicas, not all sent to one.
    assert sum(1 for replica in replicas if replica.served) >= 2
    # The ratio metric saw each continuation, apart from the first turns.
    ratios = middleware.stats.snapshot()["prompt_cache_ratio"][MODEL]
    assert ratios["continuation"]["count"] == CONVERSATIONS * (TURNS - 1)
    assert ratios["first"]["count"] == CONVERSATIONS
    assert ratios["first"]["buckets"]["0.0"] == CONVERSATIONS  # a first turn cannot hit


@pytest.mark.skipif(not installed("vllm-router"), reason="vllm-router is not installed")
def test_a_replica_that_dies_costs_its_conversations_one_prefill_once_the_router_drops_it() -> None:
    """A replica stops mid-run; once the router's health check has dropped it (checked every
    second here), the keys it served move with the ring to the others: each conversation it
    held finds its next turn cold (one prefill), then hits again; none fails."""
    replicas = [Replica(f"replica-{n}") for n in range(3)]
    servers = [serve(replica_app(replica)) for replica in replicas]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(server) for server in servers]
        health = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1")
        front = stack.enter_context(router("vllm-router", urls, *health))
        proxy = stack.enter_context(
            serve(WebSocketModeMiddleware(create_proxy(front + "/v1")), lifespan="on")
        )
        sockets = [stack.enter_context(connect(proxy)) for _ in range(CONVERSATIONS)]
        chats = [Chat(socket) for socket in sockets]
        for _ in range(3):
            for chat in chats:
                chat.turn()
        # Which replica holds which conversation: the one whose cache served its last turn.
        served = [len(replica.served) for replica in replicas]
        victim = max(range(len(replicas)), key=served.__getitem__)
        held = [chat for chat in chats if chat.replica_of(replicas) == victim]
        assert held
        servers[victim].__exit__(None, None, None)
        deadline = time.monotonic() + 30
        while healthy(front, urls[victim]):
            assert time.monotonic() < deadline, "the router never dropped the dead replica"
            time.sleep(0.1)
        after = [[cached_share([chat.turn()]) for chat in chats] for _ in range(2)]
    first_after, second_after = after
    for chat, ratio in zip(chats, first_after, strict=True):
        # Moved: one cold prefill. Stayed: a hit, as before.
        assert (ratio == 0.0) == (chat in held), (ratio, chat in held)
    assert all(ratio > 0.5 for ratio in second_after)


class Chat:
    """One conversation on a socket: `turn()` sends its next turn."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.instructions = "You are agent " + words(40)
        self.previous: str | None = None
        self.last_text = ""

    def turn(self) -> dict[str, Any]:
        """Send the next turn; the usage its response reported."""
        create: dict[str, Any] = {"type": "response.create", "model": MODEL}
        create["input"] = [{"role": "user", "content": "Do this: " + words(30)}]
        create["instructions"] = self.instructions
        if self.previous is not None:
            create["previous_response_id"] = self.previous
        self.socket.send(create)
        event = self.socket.receive_turn(timeout=20)[-1]
        assert event["type"] == "response.completed", event
        response = event["response"]
        self.previous = response["id"]
        self.last_text = response["output"][0]["content"][0]["text"]
        usage: dict[str, Any] = response["usage"]
        return usage

    def replica_of(self, replicas: list[Replica]) -> int:
        """The replica that answered its last turn (its answer names it)."""
        return next(
            n for n, replica in enumerate(replicas) if self.last_text.startswith(replica.name + " ")
        )


def healthy(router: str, worker: str) -> bool:
    """Whether the router still counts `worker` healthy (its `/workers`)."""
    workers = httpx.get(router + "/workers", timeout=5).json()["workers"]
    return any(each["url"] == worker and each["is_healthy"] for each in workers)
