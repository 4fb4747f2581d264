"""Tutorial client: one conversation of three turns over one socket, with the openai SDK.

Each turn sends only its new input and the previous response's id; the server keeps the rest
(docs/tutorial.md). Start a server of the tutorial first, then:

    python examples/tutorial/client.py
"""

from openai import Omit, OpenAI, omit

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")  # the tutorial checks none
with client.responses.connect() as connection:  # one socket: ws://127.0.0.1:8000/v1/responses
    previous: str | Omit = omit
    for question in ["Hello", "What did I just say?", "Thanks"]:
        connection.response.create(model="any", input=question, previous_response_id=previous)
        for event in connection:  # this turn's events, up to its last one
            if event.type == "response.completed":
                print(event.response.output_text)
                previous = event.response.id
                break
            if event.type in ("error", "response.failed", "response.incomplete"):
                raise RuntimeError(f"the turn failed: {event}")
