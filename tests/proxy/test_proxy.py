"""`ws_mode.proxy` and `ws-mode proxy`: WebSocket mode for a Responses server in another process.

Upstreams run in their own processes (`tests/proxy_upstream.py`): the stateless reference server,
and a storing server that keeps responses, resolves `previous_response_id` itself and wants an
API key. The proxy, wrapped by the middleware, runs under uvicorn; clients are the real openai
SDK (over the socket and over plain HTTP) and httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses.responses_server_event import ResponseWsError

from tests.integration.clients import sdk_recv, sdk_until_terminal
from tests.servers import free_port, serve, stop
from ws_mode import ConfigError, WebSocketModeMiddleware
from ws_mode.proxy import ResponsesProxy, create_proxy
from ws_mode.proxy._transport import Transport

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-upstream-test-key"
RECV = 10.0
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {}},
    }
]

# ----------------------------------------------------------------------------- processes


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20.0
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the process exited early:\n{log.read_text(errors='replace')}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def upstream_process(app: str, logs: Path, key: str | None = None) -> Iterator[str]:
    """Run `tests.proxy_upstream --app APP` in its own process; yield its origin."""
    port = free_port()
    command = [sys.executable, "-m", "tests.proxy_upstream", "--app", app, "--port", str(port)]
    if key is not None:
        command += ["--key", key]
    log = logs / f"{app}-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_listening(port, process, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process, 5)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proxy-logs")


@pytest.fixture(scope="module")
def reference(logs: Path) -> Iterator[str]:
    with upstream_process("reference", logs) as origin:
        yield origin


@pytest.fixture(scope="module")
def storing(logs: Path) -> Iterator[str]:
    with upstream_process("storing", logs, key=KEY) as origin:
        yield origin


def proxied(upstream: str, **options: Any) -> Any:
    """The proxy to `upstream`, wrapped by the middleware, under uvicorn (a context manager)."""
    middleware = {
        name: options.pop(name) for name in ("full_context", "on_cache_miss") if name in options
    }
    return serve(WebSocketModeMiddleware(create_proxy(upstream, **options), **middleware))


@pytest.fixture(scope="module")
def reference_proxy(reference: str) -> Iterator[str]:
    """Stateless upstream: the middleware sends the whole history every turn."""
    with proxied(reference + "/v1") as base:
        yield base


@pytest.fixture(scope="module")
def storing_proxy(storing: str) -> Iterator[str]:
    """The client's Authorization passes through; uncached ids are forwarded upstream."""
    with proxied(storing + "/v1", on_cache_miss="forward") as base:
        yield base


@pytest.fixture(scope="module")
def keyed_proxy(storing: str) -> Iterator[str]:
    """The proxy sends its own key, whatever the client sends."""
    with proxied(storing + "/v1", api_key=KEY) as base:
        yield base


def sdk(base: str, api_key: str = KEY) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=RECV)


def new_tag() -> str:
    return uuid.uuid4().hex


def upstream_requests(storing: str, tag: str) -> list[dict[str, Any]]:
    """What the storing upstream received for requests tagged `tag`."""
    found = httpx.get(storing + "/debug/requests", timeout=RECV).json()
    return [
        request
        for request in found
        if isinstance(request["body"], dict)
        and (request["body"].get("metadata") or {}).get("tag") == tag
    ]


def headers_of(request: dict[str, Any]) -> dict[str, str]:
    return dict(request["headers"])


def user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": text}]


def text_of(response: Any) -> str:
    for item in response.output:
        if item.type == "message":
            return "".join(part.text for part in item.content if part.type == "output_text")
    raise AssertionError(f"no message in {response.output}")


def expect_ws_error(event: Any, status: int, code: str | None) -> ResponseWsError:
    assert isinstance(event, ResponseWsError), event
    assert event.status == status, event
    assert event.error.code == code, event
    assert event.error.message
    return event


# ----------------------------------------------------------------------------- the path rule


def test_url_for_follows_the_documented_path_rule() -> None:
    based = create_proxy("http://host:8000/v1/")
    assert based.url_for("/v1/responses") == "http://host:8000/v1/responses"
    assert based.url_for("/v1/responses/resp_1", b"include=x") == (
        "http://host:8000/v1/responses/resp_1?include=x"
    )
    assert based.url_for("/v1") == "http://host:8000/v1"
    assert based.url_for("/health") == "http://host:8000/health"  # outside /v1: the origin
    nested = create_proxy("https://gateway.example/api/v1")
    assert nested.url_for("/v1/models") == "https://gateway.example/api/v1/models"
    assert nested.url_for("/v1alpha/x") == "https://gateway.example/v1alpha/x"
    bare = create_proxy("http://localhost:11434")
    assert bare.url_for("/v1/responses") == "http://localhost:11434/v1/responses"
    assert bare.url_for("/api/tags") == "http://localhost:11434/api/tags"


@pytest.mark.parametrize(
    "options",
    [
        {"upstream": "localhost:8000/v1"},
        {"upstream": "ftp://host/v1"},
        {"upstream": "http:///v1"},
        {"upstream": "http://host/v1?x=1"},
        {"upstream": "http://host/v1", "api_key": " "},
        {"upstream": "http://host/v1", "timeout": 0},
        {"upstream": "http://host/v1", "client": object()},
    ],
)
def test_bad_settings_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        create_proxy(**options)


def test_repr_and_describe_hide_secrets() -> None:
    proxy = create_proxy("http://user:secret@host:1/v1", api_key="sk-secret")
    assert "secret" not in repr(proxy)
    assert proxy.describe() == "http://***@host:1/v1"


def test_lifespan_creates_and_closes_the_client() -> None:
    proxy = create_proxy("http://127.0.0.1:9/v1")
    sent: list[dict[str, Any]] = []
    transports: list[Transport] = []

    async def run() -> None:
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

        async def receive() -> dict[str, Any]:
            message = next(messages)
            if message["type"] == "lifespan.shutdown":
                transports.append(proxy.transport)  # what startup made
            return message

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await proxy({"type": "lifespan"}, receive, send)

    asyncio.run(run())
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert transports[0].closed


@pytest.mark.parametrize("kind", ["aiohttp", "httpx"])
def test_a_client_of_your_own_is_used_and_left_open(storing: str, kind: str) -> None:
    if kind == "aiohttp":
        aiohttp = pytest.importorskip("aiohttp")

    async def run() -> tuple[int, bool]:
        # The key is only in the client's own default headers: a 200 shows it was used.
        key = {"authorization": f"Bearer {KEY}"}
        own: Any = aiohttp.ClientSession(headers=key) if kind == "aiohttp" else None
        own = own or httpx.AsyncClient(headers=key)
        proxy = create_proxy(storing + "/v1", client=own)
        transport = httpx.ASGITransport(app=proxy)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as front:
            status = (await front.get("/v1/models")).status_code
        await proxy.aclose()
        closed = bool(own.closed if kind == "aiohttp" else own.is_closed)
        await (own.close() if kind == "aiohttp" else own.aclose())
        return status, closed

    assert asyncio.run(run()) == (200, False)


def test_an_httpx_client_carries_socket_turns_failures_and_departures(storing: str) -> None:
    # The transport used when aiohttp is not installed, or when an httpx client is passed.
    own = httpx.AsyncClient(headers={"authorization": f"Bearer {KEY}"})
    try:
        with proxied(storing + "/v1", client=own) as base, sdk(base) as client:
            with client.responses.connect() as conn:
                conn.response.create(model="m", input="hello")
                assert sdk_until_terminal(conn, timeout=RECV)[-1].type == "response.completed"
                conn.response.create(model="m", input="hi", metadata={"break_after": "3"})
                expect_ws_error(sdk_until_terminal(conn, timeout=RECV)[-1], 502, "upstream_error")
            stream = client.responses.create(
                model="m", input="hi", metadata={"gap": "0.3"}, stream=True
            )
            first = next(iter(stream))
            stream.close()
            _wait_aborted(storing, first.response.id)
    finally:
        asyncio.run(own.aclose())


# ----------------------------------------------------------------------------- over the socket


def _tool_loop(conn: Any, questions: dict[str | None, str], tool_calls: int) -> dict[Any, Any]:
    """Run one tool loop per lane at once (incremental input); return each lane's responses."""
    meta = {"reference_tool_calls": str(tool_calls)}
    responses: dict[str | None, list[Any]] = {lane: [] for lane in questions}
    for lane, question in questions.items():
        lane_field = {"stream_id": lane} if lane else {}
        conn.response.create(
            model="reference", input=user(question), tools=TOOLS, metadata=meta, **lane_field
        )
    running = set(questions)
    deadline = time.monotonic() + RECV
    while running:
        event = sdk_recv(conn, max(0.01, deadline - time.monotonic()))
        lane = getattr(event, "stream_id", None)
        assert lane in running, event
        assert event.type != "error", event
        if event.type != "response.completed":
            continue
        response = event.response
        responses[lane].append(response)
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            running.discard(lane)
            continue
        outputs = [
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
            for call in calls
        ]
        conn.response.create(
            model="reference",
            previous_response_id=response.id,
            input=outputs,
            tools=TOOLS,
            metadata=meta,
            **({"stream_id": lane} if lane else {}),
        )
    return responses


def _http_tool_loop(origin: str, question: str, tool_calls: int) -> list[dict[str, Any]]:
    """The same loop over plain HTTP, straight at the upstream, with the whole history."""
    meta = {"reference_tool_calls": str(tool_calls)}
    context = user(question)
    responses = []
    with httpx.Client(base_url=origin, timeout=RECV) as client:
        while True:
            body = {"model": "reference", "input": context, "tools": TOOLS, "metadata": meta}
            response = client.post("/v1/responses", json=body).raise_for_status().json()
            responses.append(response)
            calls = [item for item in response["output"] if item["type"] == "function_call"]
            context = [*context, *response["output"]]
            if not calls:
                return responses
            context += [
                {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
                for call in calls
            ]


def test_socket_tool_loop_on_lanes_through_the_proxy(reference_proxy: str, reference: str) -> None:
    questions = {None: "What is the default?", "left": "Left?", "right": "And right?"}
    with sdk(reference_proxy) as client, client.responses.connect() as conn:
        responses = _tool_loop(conn, questions, tool_calls=2)
    for lane, question in questions.items():
        chain = responses[lane]
        assert len(chain) == 3, chain  # two tool calls, then the answer
        for parent, child in itertools.pairwise(chain):
            assert child.previous_response_id == parent.id
        # The stateless upstream got the whole history each turn: the same answer as an HTTP
        # client that re-sent everything itself.
        expected = _http_tool_loop(reference, question, tool_calls=2)
        assert text_of(chain[-1]) == expected[-1]["output"][0]["content"][0]["text"]
        assert chain[-1].usage.input_tokens == expected[-1]["usage"]["input_tokens"]


def test_sse_flows_event_by_event_to_the_socket(storing_proxy: str, storing: str) -> None:
    tag = new_tag()
    upstream = httpx.Client(base_url=storing, headers={"authorization": f"Bearer {KEY}"})
    with upstream, sdk(storing_proxy) as client, client.responses.connect() as conn:
        started = time.monotonic()
        conn.response.create(
            model="m", input="one two three four five", metadata={"tag": tag, "gap": "0.1"}
        )
        first = sdk_recv(conn, RECV)
        first_at = time.monotonic() - started
        assert first.type == "response.created"
        # The upstream has not finished the response yet when its first event is here.
        live = upstream.get(f"/v1/responses/{first.response.id}").json()
        assert live["status"] == "in_progress"
        events = [first, *sdk_until_terminal(conn, timeout=RECV)]
        last_at = time.monotonic() - started
    assert events[-1].type == "response.completed"
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) == 6  # "items=1 last=one two three four five"
    assert last_at - first_at > 1.0, (first_at, last_at)  # ~15 gaps of 0.1 s between them
    assert upstream_requests(storing, tag)[0]["body"]["stream"] is True


def test_auth_passes_through_or_is_replaced(
    storing_proxy: str, keyed_proxy: str, storing: str
) -> None:
    tag = new_tag()
    # Passed through: the upstream refuses a wrong key, the socket client sees its 401.
    with sdk(storing_proxy, api_key="sk-wrong") as client, client.responses.connect() as conn:
        conn.response.create(model="m", input="hi", metadata={"tag": tag})
        (event,) = sdk_until_terminal(conn, timeout=RECV)
        expect_ws_error(event, 401, "invalid_api_key")
    # Replaced: the proxy's own key goes up, whatever the client sent.
    with sdk(keyed_proxy, api_key="sk-wrong") as client, client.responses.connect() as conn:
        conn.response.create(model="m", input="hi", metadata={"tag": tag})
        events = sdk_until_terminal(conn, timeout=RECV)
        assert events[-1].type == "response.completed", events[-1]
    sent = [headers_of(request) for request in upstream_requests(storing, tag)]
    assert [headers["authorization"] for headers in sent] == ["Bearer sk-wrong", f"Bearer {KEY}"]
    for headers in sent:
        assert headers["accept-encoding"] == "identity"
        assert headers["host"] == storing.removeprefix("http://")
        assert not any(name.startswith("sec-websocket") for name in headers)


def test_upstream_down_is_an_error_event_502() -> None:
    with proxied(f"http://127.0.0.1:{free_port()}/v1") as base, sdk(base) as client:
        with client.responses.connect() as conn:
            for _ in range(2):  # the socket stays usable
                conn.response.create(model="m", input="hi")
                (event,) = sdk_until_terminal(conn, timeout=RECV)
                expect_ws_error(event, 502, "upstream_unreachable")
        with pytest.raises(openai.APIStatusError) as raised:
            client.models.list()
        assert raised.value.status_code == 502
        assert raised.value.body["code"] == "upstream_unreachable"  # type: ignore[index]


def test_upstream_timeouts_are_504(storing: str) -> None:
    with proxied(storing + "/v1", api_key=KEY, timeout=0.5) as base, sdk(base) as client:
        # Before the answer started: a 504 over HTTP and over the socket.
        with pytest.raises(openai.APIStatusError) as raised:
            client.responses.create(model="m", input="hi", metadata={"delay": "2"})
        assert raised.value.status_code == 504
        with client.responses.connect() as conn:
            conn.response.create(model="m", input="hi", metadata={"delay": "2"})
            (event,) = sdk_until_terminal(conn, timeout=RECV)
            expect_ws_error(event, 504, "upstream_timeout")
            # In the middle of an event stream: the events so far, then the error.
            conn.response.create(model="m", input="hi", metadata={"gap": "2"})
            events = sdk_until_terminal(conn, timeout=RECV)
            assert events[0].type == "response.created"
            expect_ws_error(events[-1], 504, "upstream_timeout")


def test_upstream_dying_mid_stream_is_an_error_event_502(storing_proxy: str) -> None:
    with sdk(storing_proxy) as client, client.responses.connect() as conn:
        conn.response.create(model="m", input="hi", metadata={"break_after": "3"})
        events = sdk_until_terminal(conn, timeout=RECV)
        assert [event.type for event in events[:3]] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
        expect_ws_error(events[-1], 502, "upstream_error")
        conn.response.create(model="m", input="still there?")
        assert sdk_until_terminal(conn, timeout=RECV)[-1].type == "response.completed"
        # Over plain HTTP the event stream ends with the same error event.
        stream = client.responses.create(
            model="m", input="hi", metadata={"break_after": "3"}, stream=True
        )
        *_, last = stream
        assert (last.type, last.code) == ("error", "upstream_error")


def _wait_aborted(storing: str, response_id: str) -> None:
    """Until the upstream lists `response_id` as cut short. It lists only streams that did not
    reach their end, so being listed is the proof; the deadline catches a hang, not a speed."""
    deadline = time.monotonic() + 30.0
    while response_id not in httpx.get(storing + "/debug/aborted", timeout=RECV).json():
        assert time.monotonic() < deadline, f"the upstream stream of {response_id} ran on"
        time.sleep(0.05)


def test_a_client_that_leaves_closes_the_upstream_stream(storing_proxy: str, storing: str) -> None:
    slow = {"gap": "0.3"}  # ~5 s of events if nobody stopped it
    with sdk(storing_proxy) as client:
        stream = client.responses.create(model="m", input="hi", metadata=slow, stream=True)
        first = next(iter(stream))
        stream.close()
        _wait_aborted(storing, first.response.id)
        with client.responses.connect() as conn:
            conn.response.create(model="m", input="hi", metadata=slow)
            first = sdk_recv(conn, RECV)
        _wait_aborted(storing, first.response.id)


# ----------------------------------------------------------------------------- over plain HTTP


def test_plain_http_through_the_proxy(storing_proxy: str) -> None:
    with sdk(storing_proxy) as client:
        created = client.responses.create(model="m", input="hello")
        assert created.status == "completed"
        assert text_of(created) == "items=1 last=hello"
        stream = client.responses.create(
            model="m", input="more", previous_response_id=created.id, stream=True
        )
        events = list(stream)
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
        assert text_of(events[-1].response) == "items=3 last=more"
        fetched = client.responses.retrieve(events[-1].response.id)
        assert fetched.id == events[-1].response.id
        assert fetched.previous_response_id == created.id
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve("resp_missing")
        assert [model.id for model in client.models.list()] == ["storing-model"]


def test_plain_http_sse_flows_event_by_event(storing_proxy: str, storing: str) -> None:
    upstream = httpx.Client(base_url=storing, headers={"authorization": f"Bearer {KEY}"})
    with upstream, sdk(storing_proxy) as client:
        started = time.monotonic()
        stream = client.responses.create(
            model="m", input="a b c", metadata={"gap": "0.1"}, stream=True
        )
        events = iter(stream)
        first = next(events)
        first_at = time.monotonic() - started
        assert upstream.get(f"/v1/responses/{first.response.id}").json()["status"] == "in_progress"
        rest = list(events)
        assert rest[-1].type == "response.completed"
        assert time.monotonic() - started - first_at > 0.8


def test_request_bodies_stream_up_and_compressed_answers_come_down_decoded(
    storing_proxy: str,
) -> None:
    parts = [os.urandom(64 * 1024) for _ in range(8)]

    def upload() -> Iterator[bytes]:
        yield from parts

    with httpx.Client(base_url=storing_proxy, timeout=RECV) as client:
        # Paths outside /v1 go to the upstream's origin.
        echoed = client.post("/debug/echo", content=upload()).json()
        assert echoed["length"] == len(b"".join(parts))
        assert echoed["transfer_encoding"] == "chunked"  # streamed, never gathered first
        assert echoed["sha256"] == hashlib.sha256(b"".join(parts)).hexdigest()
        answer = client.get("/debug/gzip", headers={"accept-encoding": "identity"})
        assert "content-encoding" not in answer.headers
        assert answer.json()["compressed"] is True


# ----------------------------------------------------------------------------- forwarding misses


def test_forward_uncached_continues_a_response_stored_upstream(
    storing_proxy: str, keyed_proxy: str, storing: str
) -> None:
    tag = new_tag()
    meta = {"tag": tag}
    upstream = httpx.Client(base_url=storing, headers={"authorization": f"Bearer {KEY}"})
    with upstream:
        body = {"model": "m", "input": "hello", "metadata": meta}
        stored = upstream.post("/v1/responses", json=body).raise_for_status().json()
    with sdk(storing_proxy) as client, client.responses.connect() as conn:
        conn.response.create(
            model="m", previous_response_id=stored["id"], input=user("again"), metadata=meta
        )
        second = sdk_until_terminal(conn, timeout=RECV)[-1]
        assert second.type == "response.completed", second
        assert second.response.previous_response_id == stored["id"]
        assert text_of(second.response) == "items=3 last=again"
        conn.response.create(
            model="m", previous_response_id=second.response.id, input=user("third"), metadata=meta
        )
        third = sdk_until_terminal(conn, timeout=RECV)[-1]
        assert third.type == "response.completed", third
        assert third.response.previous_response_id == second.response.id
        assert text_of(third.response) == "items=5 last=third"
    # Each continuation went upstream as sent: the id and only the new input.
    bodies = [request["body"] for request in upstream_requests(storing, tag)]
    assert [(b.get("previous_response_id"), b["input"]) for b in bodies] == [
        (None, "hello"),
        (stored["id"], user("again")),
        (second.response.id, user("third")),
    ]
    # Without the option, the same id is a miss.
    with sdk(keyed_proxy) as client, client.responses.connect() as conn:
        conn.response.create(model="m", previous_response_id=stored["id"], input=user("again"))
        (event,) = sdk_until_terminal(conn, timeout=RECV)
        expect_ws_error(event, 400, "previous_response_not_found")


# ----------------------------------------------------------------------------- the command


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)


def test_ws_mode_proxy_command_answers_a_socket_turn(storing: str) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "ws_mode.toolkit.cli",
        "proxy",
        "--upstream",
        storing + "/v1",
        "--port",
        str(port),
        "--forward-uncached",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "WS_MODE_UPSTREAM_API_KEY": KEY}
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        banner = lines.get(timeout=20.0)
        assert f"ws://127.0.0.1:{port}/v1/responses" in banner, banner
        assert KEY not in banner
        # The banner's SDK line works as printed (with a key of the proxy's own, any key does).
        hint = re.search(r'OpenAI\(base_url="([^"]+)", api_key="([^"]+)"\)', banner)
        assert hint is not None, banner
        assert hint.group(1) == f"http://127.0.0.1:{port}/v1"
        with sdk(f"http://127.0.0.1:{port}", api_key=hint.group(2)) as client:
            stored = client.responses.create(model="m", input="hello")  # over HTTP
            with client.responses.connect() as conn:
                conn.response.create(model="m", previous_response_id=stored.id, input="again")
                events = sdk_until_terminal(conn, timeout=RECV)
        assert events[-1].type == "response.completed", events[-1]
        assert text_of(events[-1].response) == "items=3 last=again"
    finally:
        stop(process, 5)


def test_ws_mode_proxy_command_refuses_a_bad_upstream() -> None:
    from ws_mode.toolkit.cli import main

    assert main(["proxy", "--upstream", "localhost:8000"]) == 1


def test_proxy_is_a_responses_proxy() -> None:
    assert isinstance(create_proxy("http://h/v1"), ResponsesProxy)
