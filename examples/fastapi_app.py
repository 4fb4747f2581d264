"""A stateless FastAPI Responses handler that gains WebSocket mode with one line.

The README's "Use it" shows this file (all but this docstring) and runs it:

    pip install -e . fastapi "uvicorn[standard]" "openai[realtime]"
    uvicorn examples.fastapi_app:app --ws ws_mode.server:BatchingWebSocketProtocol \\
        --ws-max-size 68157440
"""

import json
import re
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ws_mode import WebSocketModeMiddleware

app = FastAPI()
app.add_middleware(WebSocketModeMiddleware)  # adds the socket at /v1/responses


@app.post("/v1/responses")  # an ordinary stateless handler: it knows nothing of sockets
async def create(request: Request) -> Response:
    body = await request.json()  # over the socket too, "input" holds the whole history
    history = body.get("input") or []
    history = [history] if isinstance(history, str) else history
    return answer(body, f"I have seen {len(history)} item(s).")


def answer(body: dict, text: str) -> Response:  # a response of one message: JSON, or streamed
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant"}
    item |= {"status": "completed", "content": [part]}
    response = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "status": "completed"}
    response |= {"created_at": int(time.time()), "model": body.get("model"), "output": [item]}
    if not body.get("stream"):  # socket turns always stream
        return JSONResponse(response)
    return StreamingResponse(events(response), media_type="text/event-stream")


async def events(done: dict):  # the SSE of a one-message response; ws_mode sends them as frames
    item, part = done["output"][0], done["output"][0]["content"][0]
    at = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    pending = {**item, "status": "in_progress", "content": []}
    words = re.findall(r" ?\S+", part["text"])
    stream = [
        ("response.created", {"response": {**done, "status": "in_progress", "output": []}}),
        ("response.output_item.added", {"output_index": 0, "item": pending}),
        ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
        *[("response.output_text.delta", {**at, "delta": word}) for word in words],
        ("response.output_text.done", {**at, "text": part["text"]}),
        ("response.content_part.done", {**at, "part": part}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": done}),
    ]
    for number, (kind, fields) in enumerate(stream):
        data = {"type": kind, "sequence_number": number, **fields}
        yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
