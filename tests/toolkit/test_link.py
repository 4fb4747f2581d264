"""The link model (`ws_mode.toolkit.link`): link specs parse and describe themselves; the relay,
in its own process, carries bytes intact and in order both ways, delays them by the round trip,
limits the rate, bounds what it holds, passes on half-closes and resets, carries real HTTP and
WebSocket-mode rollouts, and ends with its parent."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ws_mode import WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread, bind_loopback, origin
from ws_mode.toolkit.link import QUEUE_LIMIT, LinkSpec, link_process
from ws_mode.toolkit.reference import ReferenceConfig, create_app
from ws_mode.toolkit.rollout import run_http, run_socket

RESET = b"RESET!"

# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rtt=30ms,up=10mbit,down=50mbit", LinkSpec(0.03, 1_250_000, 6_250_000)),
        ("", LinkSpec(0.0, None, None)),
        ("rtt=5", LinkSpec(0.005, None, None)),
        ("rtt=250us", LinkSpec(0.00025, None, None)),
        (" RTT = 2s , Down = 300kbit ", LinkSpec(2.0, None, 37_500)),
        ("up=1.5gbps", LinkSpec(0.0, 187_500_000, None)),
        ("rtt=1e-1s,down=2.5e+3kbit", LinkSpec(0.1, None, 312_500)),
        ("up=8bit,down=8bps", LinkSpec(0.0, 1, 1)),
        ("down=16kbps,up=2mbps", LinkSpec(0.0, 250_000, 2_000)),
    ],
)
def test_specs_parse(text: str, expected: LinkSpec) -> None:
    spec = LinkSpec.parse(text)
    assert spec.rtt == pytest.approx(expected.rtt)
    assert spec.up == pytest.approx(expected.up)
    assert spec.down == pytest.approx(expected.down)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rtt=-1ms", "must not be negative"),
        ("up=-5mbit", "must not be negative"),
        ("up=0mbit", "must be > 0"),
        ("down=0.0kbit", "must be > 0"),
        ("loss=1", "unknown key 'loss'"),
        ("rtt=1ms,rtt=2ms", "rtt given twice"),
        ("rtt", "expected key=value"),
        ("rtt=1ms,", "expected key=value"),
        ("up=", "expected key=value"),
        ("rtt=1h", "unknown unit 'h'"),
        ("up=5", "unknown unit 'none'"),
        ("up=5ms", "unknown unit 'ms'"),
        ("up=fastmbit", "expected a number"),
        ("rtt=nan", "expected a number"),
        ("up=1e999mbit", "must be finite"),
    ],
)
def test_bad_specs_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinkSpec.parse(text)


def test_specs_check_their_fields_and_describe_themselves() -> None:
    assert LinkSpec.parse("rtt=30ms,up=10mbit,down=50mbit").describe() == (
        "rtt 30 ms, up 10 Mbit/s, down 50 Mbit/s"
    )
    assert LinkSpec(0.0, None, 125.0).describe() == "rtt 0 ms, up unlimited, down 1 kbit/s"
    assert LinkSpec(1.5, 2.5e8, 3.0).describe() == "rtt 1.5 s, up 2 Gbit/s, down 24 bit/s"
    assert LinkSpec(0.0002, None, None).describe().startswith("rtt 200 us,")
    for rtt, up in ((-0.1, None), (float("inf"), None), (0.0, 0.0), (0.0, float("nan"))):
        with pytest.raises(ValueError, match="must be"):
            LinkSpec(rtt, up, None)


_UNITS = {"rtt": ("us", "ms", "s"), "rate": ("bit", "kbit", "mbit", "gbit", "kbps", "gbps")}


def _described_text(spec: LinkSpec) -> str:
    """What describe() says as parse text: ``rtt 30 ms, up 10 Mbit/s`` -> ``rtt=30ms,up=10mbit``."""
    items = []
    for part in spec.describe().split(", "):
        key, _, value = part.partition(" ")
        if value != "unlimited":
            items.append(f"{key}={value.replace(' ', '').removesuffix('/s')}")
    return ",".join(items)


@given(
    rtt=st.none() | st.tuples(st.integers(0, 10**6), st.sampled_from(_UNITS["rtt"])),
    up=st.none() | st.tuples(st.integers(1, 10**6), st.sampled_from(_UNITS["rate"])),
    down=st.none() | st.tuples(st.integers(1, 10**6), st.sampled_from(_UNITS["rate"])),
    order=st.permutations(["rtt", "up", "down"]),
)
def test_described_specs_read_back(
    rtt: tuple[int, str] | None,
    up: tuple[int, str] | None,
    down: tuple[int, str] | None,
    order: list[str],
) -> None:
    values = {"rtt": rtt, "up": up, "down": down}
    spec = LinkSpec.parse(",".join(f"{k}={v[0]}{v[1]}" for k in order if (v := values[k])))
    again = LinkSpec.parse(_described_text(spec))
    assert again.rtt == pytest.approx(spec.rtt, rel=1e-5, abs=1e-12)
    for mine, theirs in ((again.up, spec.up), (again.down, spec.down)):
        assert mine == (None if theirs is None else pytest.approx(theirs, rel=1e-5))


# ----------------------------------------------------------------------------- the relay

SINK = b"SINK!"  # an echo connection that starts so stops reading
TRAILER = b"<eof>"  # what the echo server sends after the client's EOF, before its own


class _Echo:
    """A TCP echo server on 127.0.0.1, a thread per connection. It echoes until EOF, then sends
    TRAILER and half-closes; on RESET it resets the connection; on SINK it stops reading. It
    records how each connection ended, by its first bytes."""

    def __init__(self) -> None:
        self.listener = bind_loopback()
        self.listener.settimeout(0.2)
        self.base_url = origin(self.listener)
        self.ended: dict[bytes, str] = {}
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="echo", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(5)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = self.listener.accept()
                threading.Thread(target=self._echo, args=(connection,), daemon=True).start()

    def _echo(self, connection: socket.socket) -> None:
        first, how = b"", "eof"
        try:
            while data := connection.recv(65536):
                first = first or data[:16]
                if data.startswith(RESET):
                    _set_linger_zero(connection)
                    how = "reset sent"
                    return
                if data.startswith(SINK):
                    self.stopping.wait(30)
                    return
                connection.sendall(data)
            connection.sendall(TRAILER)
            connection.shutdown(socket.SHUT_WR)
            connection.settimeout(5)
            connection.recv(1)  # wait for the relay to close
        except OSError as exc:
            how = "reset" if isinstance(exc, ConnectionResetError) else repr(exc)
        finally:
            connection.close()
            self.ended[first] = how


def _set_linger_zero(sock: socket.socket) -> None:
    """Make close() send a reset."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _connect(base_url: str) -> socket.socket:
    host, _, port = base_url.removeprefix("http://").partition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_eof(sock: socket.socket) -> bytes:
    parts = []
    while data := sock.recv(1 << 20):
        parts.append(data)
    return b"".join(parts)


@pytest.fixture(scope="module")
def echo() -> Iterator[_Echo]:
    server = _Echo()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fast(echo: _Echo) -> Iterator[str]:
    with link_process(LinkSpec(0.0, None, None), echo.base_url) as url:
        yield url


@pytest.fixture(scope="module")
def slow(echo: _Echo) -> Iterator[str]:
    with link_process(LinkSpec.parse("rtt=200ms,up=1mbit"), echo.base_url) as url:
        yield url


def test_the_relay_has_its_own_port_and_the_targets_scheme(echo: _Echo, fast: str) -> None:
    assert fast.startswith("http://127.0.0.1:")
    assert fast != echo.base_url
    with link_process(LinkSpec(0.0, None, None), echo.base_url + "/api") as url:
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/api")


def test_bytes_arrive_intact_and_in_order_both_ways(echo: _Echo, fast: str) -> None:
    def one(seed: int) -> tuple[bytes, bytes]:
        rng = random.Random(seed)
        chunks = [rng.randbytes(rng.choice((1, 7, 1000, 65536, 200_000))) for _ in range(40)]
        with _connect(fast) as sock:

            def send() -> None:
                for chunk in chunks:
                    sock.sendall(chunk)
                sock.shutdown(socket.SHUT_WR)

            sender = threading.Thread(target=send)
            sender.start()
            received = _read_to_eof(sock)  # read while sending: the echo answers as it reads
            sender.join()
            return b"".join(chunks) + TRAILER, received

    results: list[tuple[bytes, bytes]] = []
    threads = [threading.Thread(target=lambda s=s: results.append(one(s))) for s in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 6, echo.ended
    for sent, received in results:
        assert len(received) == len(sent), echo.ended
        assert received == sent


def test_a_round_trip_takes_at_least_the_rtt(slow: str) -> None:
    with _connect(slow) as sock:
        start = time.monotonic()
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        first = time.monotonic() - start
        start = time.monotonic()
        sock.sendall(b"y")
        assert sock.recv(1) == b"y"
        second = time.monotonic() - start
    # asyncio may run a timer up to its clock's resolution early (BaseEventLoop's
    # _clock_resolution): a delay of exactly the RTT can read a few microseconds short.
    slack = 0.005
    assert first >= 0.4 - slack  # the handshake's round trip, then the bytes'
    assert second >= 0.2 - slack


def test_the_rate_limits_an_upload(slow: str) -> None:
    payload = random.Random(1).randbytes(100_000)
    with _connect(slow) as sock:
        start = time.monotonic()
        sock.sendall(payload)  # 800,000 bits at 1 Mbit/s: at least 0.8 s to serialize
        received = b""
        while len(received) < len(payload):
            received += sock.recv(1 << 20)
        elapsed = time.monotonic() - start
    assert received == payload
    assert elapsed >= 0.8


def test_a_half_close_travels_after_the_data_and_the_other_way_goes_on(fast: str) -> None:
    with _connect(fast) as sock:
        sock.sendall(b"half-close " * 1000)
        sock.shutdown(socket.SHUT_WR)
        # The echo server sends its trailer only after it read our EOF, then closes its side.
        assert _read_to_eof(sock) == b"half-close " * 1000 + TRAILER


def test_a_reset_on_either_side_resets_the_other(echo: _Echo, fast: str) -> None:
    with _connect(fast) as sock:
        sock.sendall(RESET)  # the server resets
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
    token = b"token-%d" % os.getpid()
    sock = _connect(fast)
    sock.sendall(token)
    assert sock.recv(100) == token
    _set_linger_zero(sock)
    sock.close()  # the client resets
    deadline = time.monotonic() + 10
    while token not in echo.ended and time.monotonic() < deadline:
        time.sleep(0.02)
    assert echo.ended.get(token) == "reset"


def test_the_relay_holds_a_bounded_amount(fast: str) -> None:
    sent = 0
    with _connect(fast) as sock:
        sock.sendall(SINK)  # the server stops reading: only buffers and the relay's queue fill
        sock.setblocking(False)
        block = bytes(1 << 20)
        while sent < 256 << 20:
            try:
                sent += sock.send(block)
            except BlockingIOError:
                if not select.select([], [sock], [], 1.0)[1]:
                    break  # a full second with no room: the relay stopped reading
    # Socket buffers on the way hold some MiB; without backpressure the relay would take all.
    assert QUEUE_LIMIT <= sent < 96 << 20


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    app = WebSocketModeMiddleware(create_app(ReferenceConfig(tool_calls=3)))
    with ServerThread(app) as url:
        yield url


def test_http_and_websocket_mode_rollouts_go_through(reference_url: str) -> None:
    with link_process(LinkSpec.parse("rtt=20ms,up=100mbit,down=100mbit"), reference_url) as url:
        assert httpx.get(url + "/v1/responses/missing", timeout=10).status_code == 404
        over_http = run_http(url, turns=4)
        over_socket = run_socket(url, turns=4)
    direct = run_http(reference_url, turns=4)
    for result in (over_http, over_socket):
        assert result.turns == 4
        assert result.answer == direct.answer  # the answer digests the whole context
        assert min(result.turn_seconds) >= 0.02  # each turn crossed the link and back
    assert over_socket.bytes_sent < over_http.bytes_sent


def test_the_relay_ends_with_its_parent(tmp_path: Path, echo: _Echo) -> None:
    script = (
        "import time\n"
        "from ws_mode.toolkit.link import LinkSpec, link_process\n"
        f"with link_process(LinkSpec(0.0, None, None), {echo.base_url!r}) as url:\n"
        "    print(url, flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        url = parent.stdout.readline().strip()
        _connect(url).close()  # the relay accepts
        os.kill(parent.pid, signal.SIGKILL)  # no finally runs: the child must notice alone
        parent.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                _connect(url).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the relay still accepts after its parent died")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
