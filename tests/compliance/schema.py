"""The Open Responses schema as the compliance cases check it, written down field by field.

Each object kind maps its required fields to the JSON types they may hold (``"integer|null"``:
an integer or null); nested objects are checked by kind (an output item by its ``type``, a tool,
``usage``, an event's ``response``). Fields outside the schema are allowed, as the suite's
parsers allow them. On top of these checks every object also goes through the openai SDK's own
model (`Response`, `ResponseStreamEvent`, `ResponsesServerEvent`, and for a compacted object
`ResponseCompactionItem` and `ResponseUsage`), so an answer must satisfy both.

Each check returns a list of problems (``"path: what is wrong"``); empty means valid.
"""

from __future__ import annotations

from typing import Any

from openai.types.responses import (
    Response,
    ResponseCompactionItem,
    ResponseStreamEvent,
    ResponseUsage,
)
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter, ValidationError

Spec = dict[str, str]

RESPONSE: Spec = {
    "id": "string",
    "object": "string",
    "created_at": "integer",
    "completed_at": "integer|null",
    "status": "string",
    "incomplete_details": "object|null",
    "model": "string",
    "previous_response_id": "string|null",
    "instructions": "string|null",
    "output": "array",
    "error": "object|null",
    "tools": "array",
    "tool_choice": "string|object",
    "truncation": "string",
    "parallel_tool_calls": "boolean",
    "text": "object",
    "top_p": "number",
    "presence_penalty": "number",
    "frequency_penalty": "number",
    "top_logprobs": "integer",
    "temperature": "number",
    "reasoning": "object|null",
    "usage": "object|null",
    "max_output_tokens": "integer|null",
    "max_tool_calls": "integer|null",
    "store": "boolean",
    "background": "boolean",
    "service_tier": "string",
    "metadata": "object",
    "safety_identifier": "string|null",
    "prompt_cache_key": "string|null",
}
COMPACTED: Spec = {
    "id": "string",
    "object": "string",
    "output": "array",
    "created_at": "integer",
    "usage": "object",
}
USAGE: Spec = {
    "input_tokens": "integer",
    "output_tokens": "integer",
    "total_tokens": "integer",
    "input_tokens_details": "object",
    "output_tokens_details": "object",
}
ITEMS: dict[str, Spec] = {
    "message": {"type": "string", "id": "string", "status": "string", "role": "string",
                "content": "array"},
    "function_call": {"type": "string", "id": "string", "call_id": "string", "name": "string",
                      "arguments": "string", "status": "string"},
    "function_call_output": {"type": "string", "id": "string", "call_id": "string",
                             "output": "string|array", "status": "string"},
    "reasoning": {"type": "string", "id": "string", "summary": "array"},
    "compaction": {"type": "string", "id": "string", "encrypted_content": "string"},
}  # fmt: skip
PARTS: dict[str, Spec] = {
    "input_text": {"type": "string", "text": "string"},
    "output_text": {"type": "string", "text": "string", "annotations": "array"},
    "text": {"type": "string", "text": "string"},
    "summary_text": {"type": "string", "text": "string"},
    "reasoning_text": {"type": "string", "text": "string"},
    "refusal": {"type": "string", "refusal": "string"},
    "input_image": {"type": "string", "image_url": "string|null", "detail": "string"},
    "input_file": {"type": "string"},
}
FUNCTION_TOOL: Spec = {
    "type": "string",
    "name": "string",
    "description": "string|null",
    "parameters": "object|null",
    "strict": "boolean|null",
}
_WHERE: Spec = {"type": "string", "sequence_number": "integer", "item_id": "string",
                "output_index": "integer"}  # fmt: skip
_LIFECYCLE: Spec = {"type": "string", "sequence_number": "integer", "response": "object"}
_ITEM_EVENT: Spec = {"type": "string", "sequence_number": "integer", "output_index": "integer",
                     "item": "object|null"}  # fmt: skip
EVENTS: dict[str, Spec] = {
    **{f"response.{name}": _LIFECYCLE
       for name in ("created", "queued", "in_progress", "completed", "failed", "incomplete")},
    "response.output_item.added": _ITEM_EVENT,
    "response.output_item.done": _ITEM_EVENT,
    "response.content_part.added": {**_WHERE, "content_index": "integer", "part": "object"},
    "response.content_part.done": {**_WHERE, "content_index": "integer", "part": "object"},
    "response.output_text.delta": {**_WHERE, "content_index": "integer", "delta": "string"},
    "response.output_text.done": {**_WHERE, "content_index": "integer", "text": "string"},
    "response.function_call_arguments.delta": {**_WHERE, "delta": "string"},
    "response.function_call_arguments.done": {**_WHERE, "arguments": "string"},
    "error": {"type": "string", "sequence_number": "integer", "error": "object"},
}  # fmt: skip
SSE_ERROR: Spec = {"type": "string", "code": "string|null", "message": "string",
                   "param": "string|null"}  # fmt: skip
WS_ERROR: Spec = {"type": "string", "status": "integer", "error": "object"}
WS_ERROR_PAYLOAD: Spec = {"code": "string", "message": "string"}
ENUMS: dict[str, frozenset[str]] = {
    "truncation": frozenset({"auto", "disabled"}),
    "tool_choice": frozenset({"none", "auto", "required"}),
    "status": frozenset({"in_progress", "completed", "incomplete"}),
    "role": frozenset({"user", "assistant", "system", "developer"}),
}
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
_STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
_SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(ResponsesServerEvent)
_RESPONSE: TypeAdapter[Any] = TypeAdapter(Response)
_COMPACTION_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseCompactionItem)
_USAGE: TypeAdapter[Any] = TypeAdapter(ResponseUsage)


def json_type(value: Any) -> str:
    """The JSON type of a decoded value (``integer`` apart from ``number``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def check_fields(value: Any, spec: Spec, path: str) -> list[str]:
    """``value`` is an object holding every field of ``spec``, each of an allowed type."""
    if not isinstance(value, dict):
        return [f"{path or '(root)'}: expected an object, got {json_type(value)}"]
    problems = []
    for field, kinds in spec.items():
        where = f"{path}.{field}" if path else field
        if field not in value:
            problems.append(f"{where}: required")
            continue
        found = json_type(value[field])
        allowed = kinds.split("|")
        if found not in allowed and not (found == "integer" and "number" in allowed):
            problems.append(f"{where}: expected {kinds}, got {found}")
    return problems


def _sdk(model: TypeAdapter[Any], value: Any, path: str) -> list[str]:
    """What the openai SDK's model of the object finds wrong with it."""
    try:
        model.validate_python(value)
    except ValidationError as exc:
        where = path or "(root)"
        return [f"{where}: openai SDK: {error['loc']}: {error['msg']}" for error in exc.errors()]
    return []


def check_part(part: Any, path: str) -> list[str]:
    """A content part, by its ``type``."""
    kind = part.get("type") if isinstance(part, dict) else None
    spec = PARTS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        return [f"{path}.type: not a content part type: {kind!r}"]
    return check_fields(part, spec, path)


def check_item(item: Any, path: str) -> list[str]:
    """An output item (``ItemField``), by its ``type``, its content parts included."""
    kind = item.get("type") if isinstance(item, dict) else None
    spec = ITEMS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        return [f"{path}.type: not an output item type: {kind!r}"]
    problems = check_fields(item, spec, path)
    problems += _enum(item, "status", path)
    if kind == "message":
        problems += _enum(item, "role", path)
        for index, part in enumerate(item.get("content") or ()):
            problems += check_part(part, f"{path}.content[{index}]")
    return problems


def _enum(value: dict[str, Any], field: str, path: str) -> list[str]:
    found = value.get(field)
    if isinstance(found, str) and found not in ENUMS[field]:
        return [f"{path}.{field}: {found!r} is not one of {sorted(ENUMS[field])}"]
    return []


def check_usage(usage: Any, path: str) -> list[str]:
    """``usage`` with its two details objects."""
    problems = check_fields(usage, USAGE, path)
    if not problems:
        details = usage["input_tokens_details"], usage["output_tokens_details"]
        cached: Spec = {"cached_tokens": "integer"}
        reasoning: Spec = {"reasoning_tokens": "integer"}
        problems += check_fields(details[0], cached, f"{path}.input_tokens_details")
        problems += check_fields(details[1], reasoning, f"{path}.output_tokens_details")
    return problems


def check_response(response: Any, path: str = "") -> list[str]:
    """A response object (``ResponseResource``), nested objects included."""
    problems = check_fields(response, RESPONSE, path)
    if problems:
        return problems
    at = f"{path}." if path else ""
    if response["object"] != "response":
        problems.append(f"{at}object: expected 'response'")
    problems += _enum(response, "truncation", path)
    if isinstance(response["tool_choice"], str):
        problems += _enum(response, "tool_choice", path)
    for index, item in enumerate(response["output"]):
        problems += check_item(item, f"{at}output[{index}]")
    for index, tool in enumerate(response["tools"]):
        if isinstance(tool, dict) and tool.get("type") == "function":
            problems += check_fields(tool, FUNCTION_TOOL, f"{at}tools[{index}]")
    problems += check_fields(response["text"], {"format": "object"}, f"{at}text")
    if response["reasoning"] is not None:
        reasoning = {"effort": "string|null", "summary": "string|null"}
        problems += check_fields(response["reasoning"], reasoning, f"{at}reasoning")
    if response["usage"] is not None:
        problems += check_usage(response["usage"], f"{at}usage")
    if response["error"] is not None:
        error = {"code": "string", "message": "string"}
        problems += check_fields(response["error"], error, f"{at}error")
    return problems + _sdk(_RESPONSE, response, path)


def check_compacted(compacted: Any) -> list[str]:
    """A ``/responses/compact`` answer (``CompactResource``). The SDK's ``CompactedResponse``
    types its output as response output items, which a user message is not (though OpenAI's
    own answer starts with the user messages), so only its compaction items and its usage go
    through the SDK's models."""
    problems = check_fields(compacted, COMPACTED, "")
    if problems:
        return problems
    if compacted["object"] != "response.compaction":
        problems.append("object: expected 'response.compaction'")
    for index, item in enumerate(compacted["output"]):
        problems += check_item(item, f"output[{index}]")
        if isinstance(item, dict) and item.get("type") == "compaction":
            problems += _sdk(_COMPACTION_ITEM, item, f"output[{index}]")
    return (
        problems
        + check_usage(compacted["usage"], "usage")
        + _sdk(_USAGE, compacted["usage"], "usage")
    )


def check_event(event: Any, *, websocket: bool = False) -> list[str]:
    """One streamed event, by its ``type``: an SSE event, or a socket event (where an error
    is the WebSocket error envelope)."""
    kind = event.get("type") if isinstance(event, dict) else None
    path = f"event {kind}"
    if websocket and kind == "error":
        problems = check_fields(event, WS_ERROR, path)
        if not problems:
            problems += check_fields(event["error"], WS_ERROR_PAYLOAD, f"{path}.error")
        return problems + _sdk(_SERVER_EVENT, event, path)
    spec = EVENTS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        return [f"{path}: not an Open Responses streaming event"]
    problems = check_fields(event, spec, path)
    if problems:
        return problems
    if "response" in spec:
        problems += check_response(event["response"], f"{path}.response")
    elif "item" in spec and event["item"] is not None:
        problems += check_item(event["item"], f"{path}.item")
    elif "part" in spec:
        problems += check_part(event["part"], f"{path}.part")
    elif kind == "error":
        problems += check_fields(event["error"], SSE_ERROR, f"{path}.error")
    return problems + _sdk(_SERVER_EVENT if websocket else _STREAM_EVENT, event, path)


def check_stream(events: list[dict[str, Any]], *, websocket: bool = False) -> list[str]:
    """Every event of a stream, and a terminal response event last with its response."""
    problems = [problem for event in events for problem in check_event(event, websocket=websocket)]
    if not events or events[-1].get("type") not in TERMINAL:
        problems.append("the stream does not end with a terminal response event")
    return problems
