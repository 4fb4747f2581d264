"""Tutorial step 1: a stateless Responses handler that renders a chat template and tokenizes.

Every request carries the whole history in `input`; the handler renders all of it through its
chat template, tokenizes it and hands the prompt to the model. Plain HTTP only: no WebSocket
mode yet (docs/tutorial.md).

Run from the clone's root:

    uvicorn examples.tutorial.step1_stateless:app
"""

from fastapi import FastAPI, Request
from fastapi.responses import Response

from examples.cache_aware_tokens import ChatTemplate, generate, input_items, stand_in_tokenizer
from examples.fastapi_app import answer

template = ChatTemplate(stand_in_tokenizer())  # your tokenizer's `encode` goes here
app = FastAPI()


@app.post("/v1/responses")
async def create(request: Request) -> Response:
    body = await request.json()
    tokens = template.render(input_items(body))  # the whole history, on every request
    prompt = template.prompt(body.get("instructions"), tokens)
    return answer(body, generate(prompt))  # JSON, or SSE when the request asks to stream
