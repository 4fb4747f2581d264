"""``ws-mode check``'s message probe: the largest message that gets through an endpoint, and
what happens to the first one that does not.

Each probe opens a socket and sends one valid ``response.create`` padded to an exact size: a
warm-up (``generate: false``) whose input text is the padding, so no model runs, sent
uncompressed so the size is what every hop carries. The sizes double from ``min_probe_bytes``
to the first failure (or to ``max_probe_bytes``), then a binary search narrows the ceiling to
within 1/64 of it (1 KiB at least); powers of two, the usual limits, are found exactly.

How the first failing size failed says which hop refused it: a close 1009 (the ASGI server's
or a proxy's frame limit), a dropped connection (daphne, granian, some proxies), an HTTP 413
at the handshake (a proxy's body limit), or ws_mode's own ``message_too_large`` error
(``Limits.max_message_bytes``), after which the socket stays usable. A ceiling set by
ws_mode itself passes the check; one set by another hop fails it, since the socket and its
cache are lost there (docs/deployment.md, "The message size limit").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ws_mode._protocol import encode_event
from ws_mode.testing._client import FrameError, SocketClosed
from ws_mode.testing._program import Step
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import error_code

from ..measure import format_bytes
from .live_report import CheckResult
from .live_socket import LiveOptions, Target, close_code, create, open_socket, refusal, turn

__all__ = ["Probe", "check_largest_message", "find_ceiling", "padded_create", "probe"]

NAME: Final = "largest message"
#: The search stops when the ceiling is known to within this fraction of it.
PRECISION: Final = 64
#: ... or to within this many bytes, whichever is larger.
RESOLUTION: Final = 1024
#: The hint of each way a message can fail to get through.
_HINTS: Final = {
    "1009": "too_large_1009",
    "dropped": "too_large_dropped",
    "413": "too_large_413",
    "error": "protocol",
    "protocol": "protocol",
}


@dataclass(frozen=True)
class Probe:
    """One size sent: whether it got through, else how it failed (``failure``: ``1009``,
    ``dropped``, ``close``, ``413``, ``handshake``, ``message_too_large``, ``error``,
    ``no_answer`` or ``protocol``) and in words (``detail``)."""

    size: int
    ok: bool
    failure: str = ""
    detail: str = ""


def padded_create(size: int, options: LiveOptions) -> dict[str, Any]:
    """A warm-up ``response.create`` whose JSON text is exactly ``size`` bytes (or as small as
    it can be, when ``size`` is smaller)."""
    request = create(options, "", generate=False)
    bare = len(encode_event(request).encode())
    request["input"] = "x" * max(0, size - bare)
    return request


def probe(target: Target, options: LiveOptions, size: int) -> Probe:
    """Send one padded warm-up of ``size`` bytes on a new socket; how it went."""
    request = padded_create(size, options)
    try:
        socket = open_socket(target, options)
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status == 413:
            return Probe(size, False, "413", "HTTP 413 at the handshake")
        return Probe(size, False, "handshake", refusal(exc)[0])
    except (InvalidHandshake, OSError) as exc:
        return Probe(size, False, "handshake", refusal(exc)[0])
    with socket:
        try:
            result = turn(socket, request, options, Step(generate=False))
        except (ConnectionClosed, SocketClosed, OSError):
            code = close_code(socket)
            if code == 1009:
                return Probe(size, False, "1009", "close 1009 (message too big)")
            if code in (None, 1006):
                return Probe(size, False, "dropped", "the connection dropped (no close frame)")
            reason = socket.connection.close_reason
            return Probe(size, False, "close", f"close {code}" + (f" ({reason})" if reason else ""))
        except TimeoutError:
            return Probe(size, False, "no_answer", f"no answer within {options.timeout:g} s")
        except (TurnFailed, FrameError) as exc:
            return Probe(size, False, "protocol", str(exc))
    if result.completed:
        return Probe(size, True)
    too_large = result.error is not None and error_code(result.error) == "message_too_large"
    return Probe(size, False, "message_too_large" if too_large else "error", result.outcome())


def find_ceiling(
    target: Target, options: LiveOptions
) -> tuple[int | None, Probe | None, list[Probe]]:
    """The largest size that got through (None: not even ``min_probe_bytes``), the first
    failure above it (None: every size up to ``max_probe_bytes`` got through), and every
    probe sent, in order."""
    probes: list[Probe] = []

    def send(size: int) -> Probe:
        probes.append(probe(target, options, size))
        return probes[-1]

    low, high = options.min_probe_bytes, options.max_probe_bytes
    passed: int | None = None
    failed: Probe | None = None
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


def check_largest_message(target: Target, options: LiveOptions) -> CheckResult:
    """The ceiling, and whether a hop other than ws_mode sets it (a failure, with a hint)."""
    passed, failed, probes = find_ceiling(target, options)
    data = {
        "ceiling_bytes": passed,
        "failed_bytes": failed.size if failed else None,
        "failure": failed.failure if failed else None,
        "probes": [asdict(one) for one in probes],
    }
    if failed is None:
        top = options.max_probe_bytes
        detail = f"≥ {format_bytes(top)}: every size up to {top} B got through"
        return CheckResult.ok(NAME, f"{detail} ({len(probes)} probes)", **data)
    if passed is None:
        detail = (
            f"not even {failed.size} B ({format_bytes(failed.size)}) got through: {failed.detail}"
        )
        return CheckResult.failed(
            NAME, detail, _HINTS.get(failed.failure, "too_large_other"), **data
        )
    ceiling = f"{format_bytes(passed)} ({passed} B)"
    if failed.failure == "message_too_large":
        detail = (
            f"{ceiling}; past it ws_mode answers message_too_large "
            "(Limits.max_message_bytes) and the socket stays usable"
        )
        return CheckResult.ok(NAME, detail, **data)
    detail = f"{ceiling} gets through; {failed.size} B: {failed.detail}"
    return CheckResult.failed(NAME, detail, _HINTS.get(failed.failure, "too_large_other"), **data)
