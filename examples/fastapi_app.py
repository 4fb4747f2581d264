"""A stateless FastAPI Responses handler that gains WebSocket mode with one line.

Run:  uvicorn examples.fastapi_app:app --ws-max-size 100000000
Then: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-").responses.connect()
"""

import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from ws_mode import WebSocketModeMiddleware

app = FastAPI()
app.add_middleware(WebSocketModeMiddleware)  # adds the socket at /v1/responses


@app.post("/v1/responses")  # an ordinary stateless handler: it knows nothing of sockets
async def create(request: Request) -> StreamingResponse:
    body = await request.json()  # over the socket too, "input" holds the whole history
    text = f"I have seen {len(body['input'])} items."
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    item["content"] = [part]
    done = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "status": "completed"}
    done |= {"created_at": int(time.time()), "model": body.get("model"), "output": [item]}
    started = {**done, "status": "in_progress", "output": []}

    async def events():  # the SSE stream plain HTTP clients get; ws_mode turns it into frames
        pairs = [("response.created", started), ("response.completed", done)]
        for number, (kind, response) in enumerate(pairs):
            data = {"type": kind, "sequence_number": number, "response": response}
            yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
