"""Tutorial step 2: the handler of step 1, unchanged, gains WebSocket mode with one line.

The middleware serves the socket at /v1/responses and calls the handler once per turn with the
whole history in `input`, as an HTTP client would have sent it (docs/tutorial.md).

Run from the clone's root:

    uvicorn examples.tutorial.step2_drop_in:app --ws-max-size 68157440
"""

from fastapi import FastAPI, Request
from fastapi.responses import Response

from examples.cache_aware_tokens import ChatTemplate, generate, input_items, stand_in_tokenizer
from examples.fastapi_app import answer
from ws_mode import WebSocketModeMiddleware

template = ChatTemplate(stand_in_tokenizer())  # your tokenizer's `encode` goes here
app = FastAPI()
app.add_middleware(WebSocketModeMiddleware)  # the one line: the socket at /v1/responses


@app.post("/v1/responses")
async def create(request: Request) -> Response:
    body = await request.json()
    tokens = template.render(input_items(body))  # the whole history, on every turn
    prompt = template.prompt(body.get("instructions"), tokens)
    return answer(body, generate(prompt))  # JSON, or SSE when the request asks to stream
