"""The largest message check of ``ws-mode check`` (:func:`check_largest_message`): the largest
message that gets through every hop to the server, and which hop refuses larger ones.

It opens a socket per size and sends one valid ``response.create`` padded to that exact size: a
warm-up (``generate: false``) whose input text is the padding, so no model runs, sent
uncompressed so the size is what every hop carries. The sizes double from ``min_probe_bytes``
to the first failure (or to ``max_probe_bytes``), then a binary search narrows the ceiling to
within 1/64 of it (1 KiB at least); powers of two, the usual limits, are found exactly. How the
first failing size failed says which hop refused it: a close 1009 (the ASGI server's or a
proxy's frame limit), a dropped connection (daphne, granian, some proxies), an HTTP 413 at the
handshake (a proxy's body limit), or ws_mode's own ``message_too_large`` error
(``Limits.max_message_bytes``), after which the socket stays usable. A ceiling set by ws_mode
itself passes the check; one set by another hop fails it, since the socket and its cache are
lost there (docs/deployment.md, "The message size limit"). The probes run on the asyncio client
(:func:`probe_size` says why). Needs websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ws_mode._protocol import TERMINAL_EVENTS, encode_event
from ws_mode.testing._client import (
    CLOSE_TIMEOUT,
    AsyncSocket,
    FrameError,
    MessageTooLarge,
    ReadLimitExceeded,
    SocketClosed,
    check_received,
    connect_async,
)
from ws_mode.testing._program import Step
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import check_type, error_code, frame_failure

from ..measure import format_bytes
from .basic import describe_refusal
from .results import (
    HINTS,
    CheckOptions,
    CheckResult,
    MiB,
    Progress,
    Target,
    checked_turn,
    hook_hint,
    hook_of,
    response_create,
    too_large_detail,
)

LARGEST_MESSAGE: Final = "largest message"
#: What to change when a message past a hop's limit does not get through, by how it failed.
SIZE_HINTS: Final[dict[str, str]] = {
    "too_large_1009": "a hop closed the socket with 1009 (message too big) before ws_mode "
    "saw the message, so the socket and its response cache are lost: raise the ASGI "
    "server's limit (uvicorn --ws-max-size, hypercorn websocket_max_message_size, daphne "
    "--websocket-max-message-size and --websocket-max-frame-size; granian is fixed at 16 "
    "MiB) or the proxy's WebSocket frame limit (nginx's client_max_body_size does not apply "
    "to WebSocket frames) to at least Limits.max_message_bytes (64 MiB by default), or pass "
    "--max-probe-bytes with the size your clients need.",
    "too_large_dropped": "a hop dropped the connection (no close frame) when the message "
    "grew: daphne and granian drop past their limit, so do some proxies, and behind nginx "
    "the ASGI server's close 1009 arrives as a dropped connection too (nginx drops the "
    "close frame when the server stops reading); raise the limit as for 1009 (uvicorn "
    "--ws-max-size, hypercorn websocket_max_message_size, daphne "
    "--websocket-max-message-size and --websocket-max-frame-size, the proxy's frame limit).",
    "too_large_413": "a hop answered the socket's handshake with HTTP 413 once messages grew: "
    "raise the proxy's body limit (nginx client_max_body_size) for the socket's location.",
    "too_large_other": "messages past this size do not get through: raise the limit of the "
    "hop that refuses them (uvicorn --ws-max-size, the proxy's frame limit), or pass "
    "--max-probe-bytes with the size your clients need.",
}

#: The search stops when the ceiling is known to within this fraction of it.
PRECISION: Final = 64
#: ... or to within this many bytes, whichever is larger.
RESOLUTION: Final = 1024
#: The hint of each way a message can fail to get through.
_PROBE_FAILURE_HINTS: Final = {
    "1009": SIZE_HINTS["too_large_1009"],
    "dropped": SIZE_HINTS["too_large_dropped"],
    "413": SIZE_HINTS["too_large_413"],
    "error": HINTS["protocol"],
    "protocol": HINTS["protocol"],
    "answer_too_large": HINTS["answer_too_large"],
}


#: The servers whose default limit a ceiling found exactly is.
_DEFAULT_LIMITS: Final = {
    16 * MiB: "the default limit of uvicorn (--ws-max-size) and hypercorn "
    "(websocket_max_message_size), and granian's fixed one",
    1 * MiB: "daphne's default limit (--websocket-max-message-size, --websocket-max-frame-size)",
}


@dataclass(frozen=True)
class SizeProbe:
    """One size sent: whether it got through, else how it failed (``failure``: ``1009``,
    ``dropped``, ``close``, ``413``, ``handshake``, ``message_too_large``, ``hook`` (a hook of
    the application raised on it), ``error``,
    ``no_answer``, ``protocol`` or ``answer_too_large``: the endpoint's answer was larger
    than ``max_message_bytes``) and in words (``detail``)."""

    size: int
    ok: bool
    failure: str = ""
    detail: str = ""
    #: With ``failure`` ``hook``: the hook of the application that raised (its error's
    #: ``param``: ``renderer``, ...).
    hook: str = ""


def padded_warm_up(size: int, options: CheckOptions) -> dict[str, Any]:
    """A warm-up ``response.create`` whose JSON text is exactly ``size`` bytes (or as small as
    it can be, when ``size`` is smaller)."""
    request = response_create(options, "", generate=False)
    bare = len(encode_event(request).encode())
    request["input"] = "x" * max(0, size - bare)
    return request


def probe_size(target: Target, options: CheckOptions, size: int) -> SizeProbe:
    """Send one padded warm-up of ``size`` bytes on a new socket; how it went.

    On asyncio, not on the blocking client: when a hop closes the socket while the message is
    still being sent (a frame limit does, on the frame's header), the blocking client's failed
    send can mark the end of the stream before its reading thread has handed on the close
    frame it already read; the close then reads as a dropped connection (1006, not 1009) and
    websockets logs an ``EOFError: stream ended`` traceback. The asyncio client reads the
    close frame first."""
    return asyncio.run(_probe_size(target, options, size))


async def _probe_size(target: Target, options: CheckOptions, size: int) -> SizeProbe:
    request = padded_warm_up(size, options)
    try:
        socket = await connect_async(
            target.base,
            target.path,
            headers=options.headers,
            open_timeout=options.timeout,
            compression=False,
            max_message_bytes=options.max_message_bytes,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status == 413:
            return SizeProbe(size, False, "413", "HTTP 413 at the handshake")
        return SizeProbe(size, False, "handshake", describe_refusal(exc)[0])
    except (InvalidHandshake, OSError, TimeoutError) as exc:
        return SizeProbe(size, False, "handshake", describe_refusal(exc)[0])
    async with socket:
        events: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(options.timeout):
                await socket.send(request)
                while not events or events[-1]["type"] not in TERMINAL_EVENTS:
                    events.append(check_type(await socket.receive()))
                    check_received(socket, options.max_message_bytes)
        except (MessageTooLarge, ReadLimitExceeded) as exc:  # the answer, not the message sent
            return SizeProbe(size, False, "answer_too_large", too_large_detail(exc))
        except (ConnectionClosed, SocketClosed, OSError):
            return await _closed_probe(socket, size)
        except TimeoutError:
            return SizeProbe(size, False, "no_answer", f"no answer within {options.timeout:g} s")
        except FrameError as exc:
            return SizeProbe(size, False, "protocol", str(frame_failure(exc.kind, exc.frame)))
        except TurnFailed as exc:
            return SizeProbe(size, False, "protocol", str(exc))
    try:
        result = checked_turn(request, events, Step(generate=False))
    except TurnFailed as exc:
        return SizeProbe(size, False, "protocol", str(exc))
    if result.completed:
        return SizeProbe(size, True)
    hook = hook_of(result.error.get("error")) if result.error is not None else None
    if hook is not None:
        return SizeProbe(size, False, "hook", result.outcome(), hook=hook)
    too_large = result.error is not None and error_code(result.error) == "message_too_large"
    return SizeProbe(size, False, "message_too_large" if too_large else "error", result.outcome())


async def _closed_probe(socket: AsyncSocket, size: int) -> SizeProbe:
    """How a probe whose socket closed failed: by the close code the peer sent."""
    connection = socket.connection
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(connection.wait_closed(), CLOSE_TIMEOUT)
    code = connection.close_code
    if code == 1009:
        return SizeProbe(size, False, "1009", "close 1009 (message too big)")
    if code in (None, 1006):
        return SizeProbe(size, False, "dropped", "the connection dropped (no close frame)")
    reason = connection.close_reason
    return SizeProbe(size, False, "close", f"close {code}" + (f" ({reason})" if reason else ""))


def find_ceiling(
    target: Target, options: CheckOptions, progress: Progress | None = None
) -> tuple[int | None, SizeProbe | None, list[SizeProbe]]:
    """The largest size that got through (None: not even ``min_probe_bytes``), the first
    failure above it (None: every size up to ``max_probe_bytes`` got through), and every
    probe sent, in order; ``progress`` hears each probe's outcome."""
    probes: list[SizeProbe] = []

    def send(size: int) -> SizeProbe:
        probe = probe_size(target, options, size)
        probes.append(probe)
        if progress is not None:
            outcome = "got through" if probe.ok else probe.detail
            progress(f"{format_bytes(size)} ({size} B): {outcome}")
        return probe

    low, high = options.min_probe_bytes, options.max_probe_bytes
    passed: int | None = None
    failed: SizeProbe | None = None
    size = min(low, high)
    while failed is None:
        result = send(size)
        if not result.ok:
            failed = result
        else:
            passed = size
            if size >= high:
                return passed, None, probes
            size = min(size * 2, high)
    if passed is None:
        return None, failed, probes
    while failed.size - passed > max(RESOLUTION, passed // PRECISION):
        middle = (passed + failed.size) // 2
        result = send(middle)
        if result.ok:
            passed = middle
        else:
            failed = result
    return passed, failed, probes


def check_largest_message(
    target: Target, options: CheckOptions, progress: Progress | None = None
) -> CheckResult:
    """The ceiling, and whether a hop other than ws_mode sets it (a failure, with a hint);
    ``progress`` hears each probe's outcome."""
    if progress is not None:
        progress(
            f"sending messages from {format_bytes(options.min_probe_bytes)} up to "
            f"{format_bytes(options.max_probe_bytes)}, one socket each (--max-probe-bytes)"
        )
    passed, failed, probes = find_ceiling(target, options, progress)
    data = {
        "ceiling_bytes": passed,
        "failed_bytes": failed.size if failed else None,
        "failure": failed.failure if failed else None,
        "probes": [asdict(one) for one in probes],
    }
    if failed is None:
        top = options.max_probe_bytes
        detail = f"≥ {format_bytes(top)}: every size up to {top} B got through"
        return CheckResult.ok(LARGEST_MESSAGE, f"{detail} ({len(probes)} probes)", **data)
    if failed.failure == "answer_too_large":  # the answer failed, whatever the size sent
        detail = f"the answer to a {failed.size} B message: {failed.detail}"
        return CheckResult.failed(LARGEST_MESSAGE, detail, HINTS["answer_too_large"], **data)
    if passed is None:
        detail = (
            f"not even {failed.size} B ({format_bytes(failed.size)}) got through: {failed.detail}"
        )
        return CheckResult.failed(LARGEST_MESSAGE, detail, _probe_hint(failed), **data)
    ceiling = f"{format_bytes(passed)} ({passed} B)"
    if failed.failure == "message_too_large":
        detail = (
            f"{ceiling}; past it ws_mode answers message_too_large "
            "(Limits.max_message_bytes) and the socket stays usable"
        )
        return CheckResult.ok(LARGEST_MESSAGE, detail, **data)
    hint = _probe_hint(failed)
    if passed in _DEFAULT_LIMITS and failed.failure != "hook":  # a server's default: name it
        hint = f"{format_bytes(passed)} is {_DEFAULT_LIMITS[passed]}; {hint}"
    detail = f"{ceiling} gets through; {failed.size} B: {failed.detail}"
    return CheckResult.failed(LARGEST_MESSAGE, detail, hint, **data)


def _probe_hint(failed: SizeProbe) -> str:
    """What to change for a size that failed as `failed` did."""
    if failed.failure == "hook":
        return hook_hint(failed.hook)
    return _PROBE_FAILURE_HINTS.get(failed.failure, SIZE_HINTS["too_large_other"])
