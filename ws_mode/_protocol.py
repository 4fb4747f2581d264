"""The wire contract's constants: event names, the `stream_id` pattern, the error envelope.

Everything both sides of the socket agree on lives here, so the middleware, the reference
server and the tools name each event and build each error the same way (docs/protocol.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import orjson

#: A lane's name: 1 to 256 characters of letters, digits, `_`, `.` and `-`.
STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}\Z")

#: The longest id a client may send (`previous_response_id`, a steer's, `response_id`): longer
#: ones are refused on arrival (`string_above_max_length`, 400). Ids are about 50 characters;
#: five times that leaves room for a handler's own scheme, and every id accepted goes whole
#: into log lines and spans (`ws_mode._logs.LOG_VALUE_CHARS` is as long).
MAX_ID_CHARS: Final = 256

#: Fields that exist only on the socket and never reach an HTTP handler.
SOCKET_ONLY_FIELDS = frozenset({"type", "stream_id", "generate"})

#: Events whose payload holds the response object.
RESPONSE_EVENTS = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    }
)
#: Terminal events of a response that finished (and is cached).
SUCCESS_EVENTS = frozenset({"response.completed", "response.incomplete"})
#: Terminal events of a response that failed.
FAILURE_EVENTS = frozenset({"response.failed", "error"})
#: Every event that ends a response.
TERMINAL_EVENTS = SUCCESS_EVENTS | FAILURE_EVENTS
#: Output items the client answers (a tool it runs, an approval it gives), each with the type
#: of its answer: a response is never cut for steering after one, and one that ends with any
#: waits for the client (`response.steer.pending`).
CLIENT_CALLS: Final = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "mcp_approval_request": "mcp_approval_response",
}


def client_call_answer(item: dict[str, Any]) -> str | None:
    """The type of the item that answers `item`, when it is a call the client must answer
    (:data:`CLIENT_CALLS`, and a `tool_search_call` the client executes), else None."""
    kind = item.get("type")
    if kind == "tool_search_call":
        return "tool_search_output" if item.get("execution") == "client" else None
    return CLIENT_CALLS.get(kind) if kind.__class__ is str else None


#: Events whose JSON the middleware decodes on the way through; the rest pass as they are.
DECODED_EVENTS = (
    RESPONSE_EVENTS | FAILURE_EVENTS | {"response.output_item.added", "response.output_item.done"}
)
#: The terminal event a finished response object's `status` calls for.
TERMINAL_EVENT_BY_STATUS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}


def error_event(
    status: int,
    type: str,
    code: str | None,
    message: str,
    *,
    param: str | None = None,
    stream_id: str | None = None,
    sequence_number: int = 0,
) -> dict[str, Any]:
    """Build the nested error envelope of an error event (docs/protocol.md, "Errors").

    Every error event has a `sequence_number` and a string `code`: clients' schemas require
    both. A missing code becomes the error's type (`server_error`, `invalid_request_error`).
    """
    event: dict[str, Any] = {
        "type": "error",
        "sequence_number": sequence_number,
        "status": status,
        "error": {"type": type, "code": code or type, "message": message, "param": param},
    }
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def error_type_for_status(status: int) -> str:
    """An error's `type` for a status: `server_error` from 500 up, else `invalid_request_error`."""
    return "server_error" if status >= 500 else "invalid_request_error"


def server_error(message: str, *, stream_id: str | None = None) -> dict[str, Any]:
    """A 500 `server_error` event: something went wrong on our side or the handler's."""
    return error_event(500, "server_error", "server_error", message, stream_id=stream_id)


#: The hooks of the application, by the middleware keyword that names each, and how an error
#: message names it. An exception one raises is the application's: the client's error says
#: which (`hook_failed`), the server's log says what it raised.
HOOKS: Final = {
    "authenticate": "authenticate hook",
    "principal_key": "principal_key function",
    "handshake_headers": "handshake_headers hook",
    "renderer": "renderer",
    "on_response": "on_response hook",
}


def hook_failed_message(hook: str) -> str:
    """What the client is told when the application's `hook` raised: which stage failed,
    nothing of the exception (that is for the server's log)."""
    return f"The application's {HOOKS.get(hook, hook)} failed on this request."


def hook_failed(hook: str, stream_id: str | None = None) -> dict[str, Any]:
    """The error event of a request a hook of the application failed: a 500 `server_error`
    whose `param` is the hook's keyword (`renderer`, ...), for programs to tell it apart from
    ws_mode's own failures."""
    return error_event(
        500,
        "server_error",
        "server_error",
        hook_failed_message(hook),
        param=hook,
        stream_id=stream_id,
    )


def encode_event(event: dict[str, Any]) -> str:
    """Encode a server event as the text of one frame."""
    return orjson.dumps(event).decode()


#: How much of an id the client sent an error message quotes. Ids are about 50 characters; a
#: longer one is cut rather than echoed whole (the client has its own copy).
QUOTED_ID_CHARS = 128


def quoted_id(value: str) -> str:
    """An id the client sent, as an error message quotes it: whole up to `QUOTED_ID_CHARS`
    characters, else its start and `...`."""
    return value if len(value) <= QUOTED_ID_CHARS else value[:QUOTED_ID_CHARS] + "..."


def not_found(response_id: str, stream_id: str | None, why: str | None = None) -> dict[str, Any]:
    """`previous_response_not_found`: the client's documented recovery is to resend the full
    context with `previous_response_id` null."""
    reason = f": {why}. Resend the full context" if why else ""
    return error_event(
        400,
        "invalid_request_error",
        "previous_response_not_found",
        f"Previous response with id '{quoted_id(response_id)}' not found{reason}.",
        param="previous_response_id",
        stream_id=stream_id,
    )


def store_unavailable(response_id: str, stream_id: str | None) -> dict[str, Any]:
    """`store_unavailable`: the response is not cached and the store could not be asked. Why
    not (the store's address, its client library's error) is for the operator's log, never
    for the client."""
    return error_event(
        503,
        "server_error",
        "store_unavailable",
        f"Previous response with id '{quoted_id(response_id)}' is not cached on this connection "
        "and the response store is unavailable; retry, or resend the full context.",
        param="previous_response_id",
        stream_id=stream_id,
    )


#: The header of the handshake's answer (the 101) naming the mode the middleware runs its
#: sockets in: its `full_context`, `always` or `on_miss`, and nothing else. The middleware sets
#: it on every accepted upgrade, never on a refusal; a `handshake_headers` hook may not.
FULL_CONTEXT_HEADER: Final = b"x-ws-mode-full-context"

#: The code of work refused for now because the server is overloaded: the process's memory
#: budget (`Limits.max_memory_bytes`) cannot hold it (the message says so). On an error event,
#: a `response.steer.failed`, a refused upgrade and a stateful HTTP answer (503). OpenAI's own
#: code for a server that cannot take the work now, which clients retry later (the Agents SDK
#: retries a socket request on it alone, besides codeless server errors).
SERVER_IS_OVERLOADED = "server_is_overloaded"

#: The code of work refused because the server is draining (shutting down): on an error event
#: for a create sent meanwhile (or queued, its turn not begun), on a `response.steer.failed`
#: for a steer, and on an upgrade not yet accepted (HTTP 503, which clients retry, where a 426
#: would send Codex to HTTP for good).
SERVER_SHUTTING_DOWN = "server_shutting_down"
#: The message of a request refused with `SERVER_SHUTTING_DOWN` on a draining socket.
SERVER_SHUTTING_DOWN_MESSAGE = "The server is shutting down; reconnect to continue."


#: The code of an HTTP request the proxy (`ws_mode.proxy`) refuses to forward (400): its path
#: could make the upstream URL leave the upstream's origin, or is not one a client sends.
INVALID_REQUEST_TARGET = "invalid_request_target"


def memory_budget_message(what: str, *, upgrade: bool = False, then: str | None = None) -> str:
    """Why `what` was refused: the process's memory budget is exhausted; what the client may
    do (a refused upgrade falls back to HTTP; `then` says it otherwise)."""
    if then is None:
        then = (
            "Use the HTTP API or retry later."
            if upgrade
            else "This connection and its responses are kept: retry shortly."
        )
    return (
        "The server cannot hold more work now (its memory budget, Limits.max_memory_bytes, is "
        f"exhausted); {what} was refused. {then}"
    )


def memory_budget_exceeded(what: str, stream_id: str | None = None) -> dict[str, Any]:
    """`server_is_overloaded` (503): the process's memory budget cannot hold `what` (a frame,
    a request); the connection and its cached responses stay."""
    return error_event(
        503,
        "server_error",
        SERVER_IS_OVERLOADED,
        memory_budget_message(what),
        stream_id=stream_id,
    )


def error_body(type: str, code: str, message: str, param: str | None = None) -> bytes:
    """The body of an HTTP error answer, as OpenAI's API writes it."""
    return orjson.dumps({"error": {"type": type, "code": code, "message": message, "param": param}})


def json_answer(
    kind: str,
    status: int,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> list[dict[str, Any]]:
    """A JSON answer (an error body, a response object) as the two ASGI messages that send
    it: `kind` is `http.response` for a request, `websocket.http.response` for a refused
    upgrade."""
    start = {
        "type": f"{kind}.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    return [start, {"type": f"{kind}.body", "body": body}]


def echoed_tool(tool: Any) -> Any:
    """A request's tool as a response object echoes it. A function tool gets every field
    OpenAI reports: ``description`` and ``parameters`` (null when not given) and ``strict``
    (true unless the request says false), a strict object schema closed with
    ``additionalProperties: false``; any other tool as it came."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    strict = tool.get("strict") is not False
    parameters = tool.get("parameters")
    if (
        strict
        and isinstance(parameters, dict)
        and parameters.get("type") == "object"
        and "additionalProperties" not in parameters
    ):
        parameters = {**parameters, "additionalProperties": False}
    return {**tool, "description": tool.get("description"), "parameters": parameters,
            "strict": strict}  # fmt: skip


def echoed_settings(body: dict[str, Any]) -> dict[str, Any]:
    """The settings of a request as a response object echoes them, OpenAI's defaults where the
    request has none: sampling (`temperature`, `top_p`, ...), `text`, `reasoning`, the limits,
    `tool_choice` and the tools (`echoed_tool`), `service_tier` (`default` for `auto`), and the
    caller's keys (`prompt_cache_key`, `safety_identifier`, `user`)."""

    def given(key: str, default: Any) -> Any:
        value = body.get(key)
        return default if value is None else value

    text: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if isinstance(body.get("text"), dict):
        text |= {key: value for key, value in body["text"].items() if value is not None}
    reasoning: dict[str, Any] = {"effort": None, "summary": None}
    if isinstance(body.get("reasoning"), dict):
        reasoning |= body["reasoning"]
    tier = body.get("service_tier")
    tools = body.get("tools")
    return {
        "background": False,
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "parallel_tool_calls": given("parallel_tool_calls", True),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": reasoning,
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default" if tier in (None, "auto") else str(tier),
        "temperature": given("temperature", 1.0),
        "text": text,
        "tool_choice": given("tool_choice", "auto"),
        "tools": [echoed_tool(tool) for tool in tools] if isinstance(tools, list) else [],
        "top_logprobs": given("top_logprobs", 0),
        "top_p": given("top_p", 1.0),
        "presence_penalty": given("presence_penalty", 0.0),
        "frequency_penalty": given("frequency_penalty", 0.0),
        "truncation": given("truncation", "disabled"),
        "user": body.get("user"),
    }
