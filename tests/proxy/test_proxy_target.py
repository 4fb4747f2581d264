"""The proxy never sends a request anywhere but to its upstream's scheme, host and port.

A request-target is what the client writes on its request line; a server built on h11
(hypercorn, uvicorn with `--http h11`) or on Twisted (daphne) hands most of it to the app as the
ASGI `path`, even one that does not start with `/` (`8405/steal`, `@host:port/x`). A proxy that
appended that path to its upstream's origin would move the port or the host, and send the
operator's `api_key` with it. The tests send raw request-targets over a plain TCP socket (a
client library would normalize them) to the proxy under every server the docs name, through
both upstream clients, with a trap listening on another loopback port: the trap must receive
nothing, the refused targets are answered 400 before any byte leaves, and requests that are
forwarded reach the upstream on the path they named.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect
from yarl import URL

from tests.proxy_target_app import PORTLESS_HOST, make_app
from tests.servers import PROCESS_SERVERS, serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._protocol import INVALID_REQUEST_TARGET
from ws_mode.proxy import TargetRefused, create_proxy
from ws_mode.proxy._transport import AiohttpTransport, HttpxTransport, Transport, _yarl_target
from ws_mode.testing._loopback import HOST, bind_loopback

KEY = "sk-operator-secret-never-to-leave"
#: Where the proxy runs: uvicorn on h11 and on httptools, hypercorn, daphne, granian.
SERVERS = ("uvicorn-h11", "uvicorn-httptools", "hypercorn", *PROCESS_SERVERS)
#: Servers that hand any request-target to the app: their answer to a refused one is the proxy's.
PASS_ANY_TARGET = ("uvicorn-h11", "hypercorn", "daphne")
TRANSPORTS = ("aiohttp", "httpx")
ANSWER = b'{"ok": true}'


# ----------------------------------------------------------------------------- listeners


@dataclass
class Recorder:
    """A loopback listener in a thread: it records the head of every request it gets and answers
    each with 200 and a small JSON body."""

    sock: socket.socket
    heads: list[bytes] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def run(self) -> None:
        while not self.stopped.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if not ready:
                continue
            connection, _ = self.sock.accept()
            with connection:
                connection.settimeout(5.0)
                with contextlib.suppress(OSError):
                    self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
        self.heads.append(data)
        body = b"" if data.startswith(b"HEAD ") else ANSWER
        connection.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(ANSWER) + body
        )

    def take(self) -> list[bytes]:
        heads, self.heads = self.heads, []
        return heads


@contextlib.contextmanager
def recording(sock: socket.socket) -> Iterator[Recorder]:
    recorder = Recorder(sock)
    thread = threading.Thread(target=recorder.run, name=f"recorder-{recorder.port}", daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.stopped.set()
        thread.join(5.0)
        sock.close()


def listen_on(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, port))
        sock.listen(16)
    except OSError:
        sock.close()
        return None
    return sock


@dataclass(frozen=True)
class Setup:
    """The trap, the upstream, and where the proxy serves."""

    trap: Recorder
    upstream: Recorder
    base_url: str
    server: str

    @property
    def port_tail(self) -> str:
        """The trap's port without the digits the upstream's port shares with it."""
        return str(self.trap.port)[len(str(self.upstream.port)) :]


@contextlib.contextmanager
def trap_and_upstream() -> Iterator[tuple[Recorder, Recorder]]:
    """A trap on a port the OS picks, and the upstream on the port its first four digits name
    (trap 48405: upstream 4840), so that a path `5/steal` appended to the upstream's origin
    would land on the trap."""
    for _ in range(50):
        trap_sock = bind_loopback()
        upstream_sock = listen_on(int(str(trap_sock.getsockname()[1])[:4]))
        if upstream_sock is not None:
            break
        trap_sock.close()
    else:
        pytest.skip("no free pair of ports sharing their first digits")
    with recording(trap_sock) as trap, recording(upstream_sock) as upstream:
        yield trap, upstream


@pytest.fixture(scope="module", params=[(s, t) for s in SERVERS for t in TRANSPORTS], ids=str)
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    server, client = request.param
    with trap_and_upstream() as (trap, upstream):
        upstream_url = f"http://{HOST}:{upstream.port}/v1"
        portless_url = f"http://{HOST}/v1"  # port 80: whatever is there, the trap is not
        if server in PROCESS_SERVERS:
            env = {
                "WS_MODE_TEST_UPSTREAM": upstream_url,
                "WS_MODE_TEST_PORTLESS_UPSTREAM": portless_url,
                "WS_MODE_TEST_KEY": KEY,
                "WS_MODE_TEST_CLIENT": client,
            }
            running = serve("tests.proxy_target_app:app", server, env=env)
        else:
            app = make_app(upstream_url, portless_url, KEY, client)
            name, _, http = server.partition("-")
            running = serve(app, name, **({"http": http} if http else {}))
        with running as base_url:
            yield Setup(trap, upstream, base_url, server)


# ----------------------------------------------------------------------------- raw requests


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def error(self) -> dict[str, Any] | None:
        """The OpenAI error of the body, if it is one."""
        with contextlib.suppress(orjson.JSONDecodeError):
            found = orjson.loads(self.body)
            if isinstance(found, dict) and isinstance(found.get("error"), dict):
                error: dict[str, Any] = found["error"]
                return error
        return None


def raw_request(base_url: str, target: bytes, host: bytes = b"proxy.test") -> Answer:
    """`GET target` written as is on a plain TCP connection; the answer's status and body."""
    port = int(base_url.rpartition(":")[2])
    request = b"GET %s HTTP/1.1\r\nhost: %s\r\nconnection: close\r\n\r\n" % (target, host)
    data = b""
    with socket.create_connection((HOST, port), 30.0) as client:
        client.sendall(request)
        while chunk := client.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return Answer(status, body)


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2 :]
    return out


def refused_targets(setup: Setup) -> list[tuple[bytes, bytes]]:
    """(host, target): each would have left the upstream's origin, or is no path a client
    sends; each must be answered 400 with nothing sent anywhere."""
    trap = str(setup.trap.port).encode()
    tail = setup.port_tail.encode()
    proxy = b"proxy.test"
    return [
        (proxy, tail + b"/steal"),  # the upstream's port, then these digits: the trap's port
        (proxy, b"@127.0.0.1:" + trap + b"/x"),  # the upstream's host:port read as credentials
        (PORTLESS_HOST, b":" + trap + b"/x"),  # an upstream URL without a port gets one
        (proxy, b"//127.0.0.1:" + trap + b"/x"),
        (proxy, b"/v1/../x"),
        (proxy, b"/v1/%2e%2e/models"),
        (proxy, b"/%2E%2E/x"),
        (proxy, b"/v1%2F..%2Fx"),
        (proxy, b"/v1/%2F%2F127.0.0.1:" + trap + b"/x"),
        (proxy, b"/v1/a\\b"),
        (proxy, b"/v1/%0d%0aX-Injected:%201"),
        (proxy, b"/v1/a%00b"),
        (proxy, b"x"),
        (proxy, b"*"),
    ]


# ----------------------------------------------------------------------------- the tests


def test_no_request_target_moves_the_upstream_or_leaks_the_key(setup: Setup) -> None:
    setup.trap.take()
    setup.upstream.take()
    for host, target in refused_targets(setup):
        answer = raw_request(setup.base_url, target, host)
        assert setup.trap.take() == [], f"{target!r} reached the trap"
        assert setup.upstream.take() == [], f"{target!r} was forwarded"
        assert answer.status == 400, (target, answer)
        error = answer.error()
        if setup.server in PASS_ANY_TARGET or error is not None:
            # The proxy answered (the server handed the target over): an OpenAI error.
            assert error is not None, (target, answer)
            assert error["type"] == "invalid_request_error", error
            assert error["code"] == INVALID_REQUEST_TARGET, error
            assert KEY not in answer.body.decode(errors="replace")


def test_an_absolute_form_target_never_reaches_another_authority(setup: Setup) -> None:
    """`GET http://host:port/x`: refused, or (a server that reads the absolute form and hands
    the app its path) forwarded to the upstream's own `/x`, never to the authority it names."""
    setup.trap.take()
    setup.upstream.take()
    target = b"http://127.0.0.1:%d/x" % setup.trap.port
    answer = raw_request(setup.base_url, target)
    assert setup.trap.take() == []
    forwarded = setup.upstream.take()
    if answer.status == 400:
        assert forwarded == []
    else:
        assert answer.status == 200, answer
        assert [head.split(b"\r\n")[0] for head in forwarded] == [b"GET /x HTTP/1.1"]


def test_forwarded_paths_keep_their_meaning_on_the_upstream(setup: Setup) -> None:
    """A path that is not refused reaches the upstream (the proxy works here, so the trap's
    silence above is no accident), encoded so that `@`, `?`, `#` and `%` stay in the path."""
    setup.trap.take()
    setup.upstream.take()
    answer = raw_request(setup.base_url, b"/v1/models/a%40b%3Fc%23d%25e?limit=2")
    assert (answer.status, answer.body) == (200, ANSWER)
    (head,) = setup.upstream.take()
    method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
    path, _, query = target.partition("?")
    assert (method, unquote(path), query) == ("GET", "/v1/models/a@b?c#d%e", "limit=2"), target
    assert b"authorization: bearer " + KEY.lower().encode() in head.lower()
    assert setup.trap.take() == []


def test_a_socket_turn_goes_through_the_same_check() -> None:
    """Socket turns reach the proxy in-process at the middleware's `handler_path`: one the proxy
    cannot forward on the upstream's origin as it is (`/v1/../admin`, which the upstream client
    would have sent to `/admin`) gives the turn an error event with status 400, and no request
    but the handshake's probe reaches the upstream."""
    with trap_and_upstream() as (trap, upstream):
        proxy = create_proxy(f"http://{HOST}:{upstream.port}/v1", api_key=KEY)
        app = WebSocketModeMiddleware(
            proxy, handler_path="/v1/../admin", handshake_headers=proxy.handshake_headers
        )
        with (
            serve(app, "uvicorn", http="h11") as base_url,
            connect(base_url.replace("http", "ws", 1) + "/v1/responses") as ws,
        ):
            ws.send(orjson.dumps({"type": "response.create", "model": "m", "input": "hi"}).decode())
            event = orjson.loads(ws.recv(timeout=30.0))
        assert (event["type"], event["status"]) == ("error", 400), event
        assert event["error"]["code"] == INVALID_REQUEST_TARGET, event
        lines = [head.split(b"\r\n")[0] for head in upstream.take()]
        assert lines == [b"HEAD /v1/responses HTTP/1.1"]  # the probe, at the socket's path
        assert trap.take() == []


# ----------------------------------------------------------------------------- the URL builder

UPSTREAMS = (
    "http://127.0.0.1:4/v1",
    "https://api.openai.com/v1",
    "http://user:secret@host.example:8000/api/v1",
    "http://[::1]:11434",
    "http://localhost",
)
#: Pieces a hostile path is made of, besides any text at all.
ATOMS = (
    *"/\\@:.?#%;=[]~ aZ9\x00\r\n\t\x7fé",
    "..", "//", "%2e", "%2E%2e", "%2F", "%40", "%5C", "%00", "%25", "v1", "/v1", "8405",
    "@127.0.0.1:9999", ":9999", ".attacker.example", "http://evil.example", "\udcff",
)  # fmt: skip
PATHS = st.one_of(
    st.text(),
    st.lists(st.sampled_from(ATOMS), max_size=12).map("".join),
    st.lists(st.sampled_from(ATOMS), max_size=12).map(lambda atoms: "/v1/" + "".join(atoms)),
)


def _origins(url: str) -> tuple[tuple[object, ...], tuple[object, ...], tuple[object, ...]]:
    """`url`'s scheme, credentials, host and port as urllib, yarl and httpx read them."""
    split = urlsplit(url)
    parsed = URL(url)
    read = httpx.URL(url)
    return (
        (split.scheme, split.username, split.password, split.hostname, split.port),
        (parsed.scheme, parsed.raw_user, parsed.raw_password, parsed.raw_host, parsed.port),
        (read.scheme, read.userinfo, read.host, read.port),
    )


@settings(max_examples=600, deadline=None)
@given(upstream=st.sampled_from(UPSTREAMS), path=PATHS, query=st.binary(max_size=40))
def test_a_built_url_is_on_the_upstream_s_origin_or_refused(
    upstream: str, path: str, query: bytes
) -> None:
    proxy = create_proxy(upstream)
    origin = "{}://{}".format(*urlsplit(upstream))
    try:
        url = proxy.url_for(path, query)
    except TargetRefused:
        return
    assert _origins(url) == _origins(origin), (path, url)
    # The path the upstream reads is the client's, moved under the upstream's base path.
    got = unquote(urlsplit(url).path)
    base = urlsplit(upstream).path
    if base and (path == "/v1" or path.startswith("/v1/")):
        assert got == base + path[len("/v1") :]
    else:
        assert got == path
    # Both clients take it as it is (their own reading of it is on the origin too).
    _yarl_target(url, origin)
    assert not any(char in url for char in "#\\\x00\r\n\x7f ")


@pytest.mark.parametrize(
    "path",
    [
        *("8405/steal", "@127.0.0.1:9999/x", ".attacker.example/x", ":9999/x", "", "x", "*"),
        *("//evil.example/x", "/v1/../x", "/v1/./x", "/..", "/a\\b", "/a\r\nb", "/a\x00b"),
    ],
)
def test_the_measured_targets_are_refused(path: str) -> None:
    for upstream in ("http://127.0.0.1:4/v1", "https://api.openai.com/v1"):
        with pytest.raises(TargetRefused):
            create_proxy(upstream).url_for(path)


def test_question_marks_hashes_and_percents_stay_in_the_path() -> None:
    proxy = create_proxy("https://api.openai.com/v1")
    assert proxy.url_for("/v1/models/a@b?c#d%2e", b"x=1#y z") == (
        "https://api.openai.com/v1/models/a%40b%3Fc%23d%252e?x=1%23y%20z"
    )


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_each_client_refuses_a_url_off_the_upstream_s_origin(kind: str) -> None:
    """The transports' own check, whatever URL reaches them: read by aiohttp's yarl or by httpx,
    a URL whose authority is not the upstream's is refused before a connection is made."""

    async def attempt(url: str, origin: str) -> None:
        timeout = httpx.Timeout(5.0)
        if kind == "aiohttp":
            transport: Transport = AiohttpTransport(AiohttpTransport.new_session(timeout))
        else:
            transport = HttpxTransport(HttpxTransport.new_client(timeout))
        try:
            with pytest.raises(TargetRefused):
                await transport.request("GET", url, [(b"authorization", b"Bearer k")], b"", origin)
        finally:
            await transport.aclose()

    with trap_and_upstream() as (trap, upstream):
        origin = f"http://{HOST}:{upstream.port}"
        tail = str(trap.port)[len(str(upstream.port)) :]
        for url in (
            f"{origin}{tail}/steal",
            f"{origin}@{HOST}:{trap.port}/x",
            f"http://{HOST}:{trap.port}/x",
            f"https://{HOST}:{upstream.port}/x",
        ):
            asyncio.run(attempt(url, origin))
        assert trap.take() == []
        assert upstream.take() == []
