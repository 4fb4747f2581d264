"""What ``ws-mode check`` found: one :class:`CheckResult` a check, the :class:`LiveReport` of a
whole run, its table (:func:`format_report`), its JSON (:func:`report_json`), and the hints
that say what to change in the server, the proxy or the load balancer when a check fails.

The checks themselves are in :mod:`~ws_mode.toolkit.check.live` and
:mod:`~ws_mode.toolkit.check.live_probe`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "CHECKS",
    "HINTS",
    "CheckResult",
    "LiveReport",
    "Status",
    "format_report",
    "report_json",
]

#: A check's outcome; ``skipped`` when it was not run (switched off, or the handshake failed).
Status = Literal["ok", "FAILED", "skipped"]

#: The width hints are wrapped to.
WIDTH: Final = 100
#: The checks, in the order they run and are shown.
CHECKS: Final = (
    "handshake",
    "warm-up",
    "chained conversation",
    "previous_response_not_found",
    "lanes",
    "error envelope",
    "largest message",
    "idle socket",
)

_NGINX_UPGRADE: Final = (
    "nginx: proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; "
    'proxy_set_header Connection "upgrade"; (HAProxy and load balancers pass upgrades '
    "by default; a CDN may need WebSockets switched on)"
)

#: What to change when a check fails, by the kind of failure.
HINTS: Final[dict[str, str]] = {
    "disabled": "WebSocket mode is switched off on this server (HTTP 426): the "
    "WebSocketModeMiddleware answers 426 while enabled=False or while it drains; clients "
    "fall back to HTTP. Switch it on (middleware.enabled = True).",
    "not_enabled": "HTTP 426 Upgrade Required: nothing speaks WebSocket mode here; put "
    "ws_mode's WebSocketModeMiddleware in front of the Responses handler.",
    "connection_limit": "the server is full (426 websocket_connection_limit_reached): raise "
    "Limits.max_connections (per worker) or add workers.",
    "credentials": "the credentials were refused: pass --api-key KEY (or set "
    "OPENAI_API_KEY) or --header 'Authorization: ...' with what your authenticate hook "
    "accepts.",
    "origin": "the Origin header was refused (403 origin_not_allowed): list it in "
    "WebSocketModeMiddleware(allowed_origins=...), or send no Origin.",
    "forbidden": "HTTP 403 without an OpenAI error body: the credentials were refused, or "
    "nothing accepts a WebSocket at this path (Starlette answers an unrouted upgrade with "
    "403): check the URL, WebSocketModeMiddleware(path=...) and the proxy's location.",
    "not_found": "nothing answers at this path (HTTP 404): check the URL (the socket is "
    "BASE/v1/responses), WebSocketModeMiddleware(path=...), the proxy's location and "
    "uvicorn --root-path when the proxy strips a prefix.",
    "stripped": "the upgrade reached a plain HTTP endpoint: a proxy in front probably drops "
    "the hop-by-hop Upgrade and Connection headers (" + _NGINX_UPGRADE + "), or the server "
    "cannot upgrade (uvicorn needs websockets or wsproto installed, and no --ws none).",
    "upstream": "the server failed on the upgrade, or the proxy in front could not reach it "
    "(HTTP 5xx): check the server's log, the proxy's upstream address, and that the ASGI "
    "server runs; " + _NGINX_UPGRADE + ".",
    "redirect": "the upgrade was redirected: point the check (and the clients) at the final "
    "URL, e.g. https:// instead of http://; WebSocket clients do not all follow redirects.",
    "handshake_413": "a hop refused the handshake with HTTP 413: raise the proxy's request "
    "size limit (nginx client_max_body_size, a load balancer's header and body limits).",
    "unreachable": "nothing listens there: check the host, the port and the scheme "
    "(https:// or wss:// for TLS).",
    "bad_handshake": "the answer to the upgrade is not a valid WebSocket handshake: a proxy "
    "or CDN in front may not support WebSockets; " + _NGINX_UPGRADE + ".",
    "model": "the model call failed: pass --model with a model your server serves.",
    "protocol": "the server's events do not follow WebSocket mode's protocol "
    "(docs/protocol.md): put ws_mode's WebSocketModeMiddleware in front of the handler, or "
    "fix the events it names.",
    "lanes": "lanes (stream_id) are part of ws_mode's protocol: the handler needs "
    "WebSocketModeMiddleware in front of it (Limits.max_streams and max_in_flight bound "
    "them).",
    "cache": "previous_response_id did not resolve on the same socket: the response cache "
    "lives in the connection; a proxy that spreads one socket's frames over workers breaks "
    "it (it cannot happen with one TCP connection per socket).",
    "closed": "the socket closed in the middle of a turn: 1001 (going away) is a proxy's or "
    "balancer's timeout, or a restart; 1011 a server error; 1009 a message over a frame "
    "limit (see the largest message check); 1006 a dropped connection. The server's log "
    "says more.",
    "too_large_1009": "a hop closed the socket with 1009 (message too big) before ws_mode "
    "saw the message, so the socket and its response cache are lost: raise the ASGI "
    "server's limit (uvicorn --ws-max-size, hypercorn websocket_max_message_size, daphne "
    "--websocket-max-message-size and --websocket-max-frame-size; granian is fixed at 16 "
    "MiB) or the proxy's WebSocket frame limit (nginx's client_max_body_size does not apply "
    "to WebSocket frames) to at least Limits.max_message_bytes (64 MiB by default), or pass "
    "--max-probe-bytes with the size your clients need.",
    "too_large_dropped": "a hop dropped the connection (no close frame) when the message "
    "grew: daphne and granian drop past their limit, so do some proxies; raise it as for "
    "1009 (uvicorn --ws-max-size, daphne --websocket-max-message-size and "
    "--websocket-max-frame-size, the proxy's frame limit).",
    "too_large_413": "a hop answered the socket's handshake with HTTP 413 once messages grew: "
    "raise the proxy's body limit (nginx client_max_body_size) for the socket's location.",
    "too_large_other": "messages past this size do not get through: raise the limit of the "
    "hop that refuses them (uvicorn --ws-max-size, the proxy's frame limit), or pass "
    "--max-probe-bytes with the size your clients need.",
    "idle": "an idle socket was closed: proxies and load balancers close sockets on which "
    "nothing moved for a while (nginx proxy_read_timeout and proxy_send_timeout, 60 s by "
    "default; HAProxy timeout tunnel; AWS ALB idle timeout, 60 s; Cloudflare, 100 s). "
    "Raise them above Limits.max_connection_seconds, or keep server pings on (uvicorn "
    "--ws-ping-interval 20, hypercorn websocket_ping_interval): pings reset those timers.",
    "idle_ws_mode": "ws_mode closed the idle socket itself (websocket_idle_timeout): "
    "Limits.max_idle_seconds is shorter than the idle time checked; raise it (or None).",
    "idle_silent": "the socket stayed open but nothing answered after the idle time: a hop "
    "dropped the connection to the server without telling the client (check the proxy's "
    "and the load balancer's idle timeouts).",
}


@dataclass
class CheckResult:
    """One check's outcome: ``detail`` says what was seen, ``hint`` (failures only) what to
    change, ``data`` the measured values for the JSON report."""

    name: str
    status: Status
    detail: str
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, name: str, detail: str, **data: Any) -> CheckResult:
        """A check that passed."""
        return cls(name, "ok", detail, data=data)

    @classmethod
    def failed(cls, name: str, detail: str, hint: str = "", **data: Any) -> CheckResult:
        """A check that failed; ``hint`` is a key of :data:`HINTS` or the hint itself."""
        return cls(name, "FAILED", detail, HINTS.get(hint, hint), data=data)

    @classmethod
    def skipped(cls, name: str, why: str) -> CheckResult:
        """A check that was not run, and why."""
        return cls(name, "skipped", why)


@dataclass
class LiveReport:
    """The checks of one endpoint (``url``, the socket's URL), in :data:`CHECKS` order."""

    url: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        """Whether no check failed (skipped ones do not count)."""
        return all(result.status != "FAILED" for result in self.results)

    def result(self, name: str) -> CheckResult:
        """The result of the check ``name``; KeyError when it is not in the report."""
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)


def format_report(report: LiveReport) -> list[str]:
    """The report as lines: a title, the table (check, result, detail), the hint of each
    failure, and a verdict."""
    rows = [(result.name, result.status, result.detail) for result in report.results]
    widths = [
        max(len(row[column]) for row in [("check", "result", ""), *rows]) for column in (0, 1)
    ]
    lines = [f"ws-mode check {report.url}", ""]
    head = f"  {'check'.ljust(widths[0])}  {'result'.ljust(widths[1])}  detail"
    lines += [head, "  " + "-" * (len(head) + 30)]
    for name, status, detail in rows:
        lines.append(f"  {name.ljust(widths[0])}  {status.ljust(widths[1])}  {detail}".rstrip())
    hints = [result for result in report.results if result.status == "FAILED" and result.hint]
    if hints:
        lines += ["", "What to change:"]
        for result in hints:
            lines += textwrap.wrap(
                f"{result.name}: {result.hint}",
                WIDTH,
                initial_indent="  ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
    failed = sum(result.status == "FAILED" for result in report.results)
    skipped = sum(result.status == "skipped" for result in report.results)
    passed = len(report.results) - failed - skipped
    verdict = f"{passed} ok, {failed} failed, {skipped} skipped"
    lines += ["", verdict + (": WebSocket mode works here" if report.ok else "")]
    return lines


def report_json(report: LiveReport) -> dict[str, Any]:
    """The report as JSON: the URL, whether it passed, and each check with its data."""
    return {
        "url": report.url,
        "ok": report.ok,
        "checks": [
            {
                "name": result.name,
                "status": result.status.lower(),
                "detail": result.detail,
                "hint": result.hint or None,
                **({"data": result.data} if result.data else {}),
            }
            for result in report.results
        ],
    }
