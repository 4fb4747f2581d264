"""Tutorial step 4: the handler made cache-aware with a renderer.

With `full_context="on_miss"` and `renderer=`, the middleware renders every item once (the
client's new input when it arrives, the model's output after the response went out) and keeps
the conversation's tokens; a socket turn takes them from the Turn and renders nothing. Plain HTTP
reaches the same handler with the whole history, rendered as in step 1 (docs/tutorial.md).

Run from the clone's root:

    uvicorn examples.tutorial.step4_cache_aware:app --ws-max-size 68157440
"""

from fastapi import FastAPI, Request
from fastapi.responses import Response

from examples.cache_aware_tokens import ChatTemplate, generate, input_items, stand_in_tokenizer
from examples.fastapi_app import answer
from ws_mode import WebSocketModeMiddleware
from ws_mode.fastapi import CurrentTurn

template = ChatTemplate(stand_in_tokenizer())  # your tokenizer's `encode` goes here
app = FastAPI()
app.add_middleware(WebSocketModeMiddleware, full_context="on_miss", renderer=template.render)


@app.post("/v1/responses")
async def create(request: Request, current: CurrentTurn) -> Response:
    body = await request.json()
    tokens = current.tokens() if current is not None else None  # rendered by the middleware
    if tokens is None:  # plain HTTP: the whole history, rendered here as in step 1
        tokens = template.render(input_items(body))
    prompt = template.prompt(body.get("instructions"), tokens)
    return answer(body, generate(prompt))
