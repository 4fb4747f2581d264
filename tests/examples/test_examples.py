"""The examples under real servers, driven by the official `openai` SDK.

Every example app runs under each server of `ALL_SERVERS` (uvicorn and hypercorn in a thread of
this process, daphne and granian in a child process) and is driven over the socket (sync and
async SDK) and over plain HTTP (streaming and not). The client example runs against the
FastAPI example. Every receive has a deadline: the helpers of tests/integration/clients.py on
the socket, the SDK's own timeout over HTTP, a thread deadline around the client example's
agent and a process timeout around its command line.
"""

from __future__ import annotations

import io
import json
import os
import runpy
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import openai
import pytest
from openai import AsyncOpenAI, OpenAI, omit
from openai.types.responses import EasyInputMessageParam, FunctionToolParam, ResponseInputParam
from openai.types.responses.response_input_param import FunctionCallOutput

from tests.client_tls import sdk_async_http_client, sdk_http_client
from tests.examples.django_env import database_path
from tests.integration.clients import async_until_terminal, sdk_until_terminal
from tests.servers import ALL_SERVERS, PROCESS_SERVERS, ROOT, serve

T = TypeVar("T")

API_KEY = "example-key"  # the Starlette example checks it on every turn
DJANGO_DIR = ROOT / "examples" / "django_project"
LIFETIME = 120.0  # no test server outlives a crashed run by more than this
TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_time",
    "description": "The current time.",
    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
    "strict": False,
}
# The developer message has 5 words.
DEVELOPER: EasyInputMessageParam = {"role": "developer", "content": "Answer in one short sentence."}


def user(text: str) -> EasyInputMessageParam:
    return {"role": "user", "content": text}


@dataclass
class Running:
    """An example app under one server."""

    server: str
    base_url: str

    def openai(self, prefix: str = "", api_key: str = API_KEY) -> OpenAI:
        base_url = f"{self.base_url}{prefix}/v1"
        return OpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=10,
            http_client=sdk_http_client(),
        )

    def async_openai(self, prefix: str = "", api_key: str = API_KEY) -> AsyncOpenAI:
        base_url = f"{self.base_url}{prefix}/v1"
        return AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=10,
            http_client=sdk_async_http_client(),
        )


def lanes(events: list[Any]) -> set[str | None]:
    return {getattr(event, "stream_id", None) for event in events}


def streamed_text(events: list[Any]) -> str:
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


def completed(events: list[Any]) -> Any:
    assert events[-1].type == "response.completed", events[-1]
    return events[-1].response


def within(seconds: float, work: Callable[[], T], on_timeout: Callable[[], object]) -> T:
    """`work()` in a thread; after `seconds`, `on_timeout()` (closing its socket) and fail."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        on_timeout()
        thread.join(5)
        raise AssertionError(f"no answer within {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


# The Starlette example.


@pytest.fixture(scope="module", params=ALL_SERVERS)
def starlette(request: pytest.FixtureRequest) -> Iterator[Running]:
    server: str = request.param
    if server in PROCESS_SERVERS:
        options: dict[str, Any] = {"env": {"EXAMPLE_API_KEY": API_KEY}}
        app: Any = "examples.starlette_app:app"
    else:
        from examples.starlette_app import create_app

        options, app = {}, create_app(api_key=API_KEY)
    with serve(app, server, lifetime=LIFETIME, **options) as base_url:
        yield Running(server, base_url)


def test_starlette_socket_sync_tool_loop(starlette: Running) -> None:
    with starlette.openai() as client, client.responses.connect() as conn:
        conn.response.create(
            tools=[TOOL],
            input=[DEVELOPER],
            generate=False,
            stream_id="main",
        )
        warm_up = sdk_until_terminal(conn)
        assert [event.type for event in warm_up] == ["response.created", "response.completed"]
        assert completed(warm_up).output == []

        conn.response.create(
            tools=[TOOL],
            input=[user("What time is it?")],
            previous_response_id=completed(warm_up).id,
            stream_id="main",
        )
        events = sdk_until_terminal(conn)
        assert lanes(events) == {"main"}
        first = completed(events)
        assert first.previous_response_id == completed(warm_up).id
        # No `model` was sent: the handler used the model its lifespan put in the state.
        assert first.model == (
            "scripted-1-without-lifespan" if starlette.server == "daphne" else "scripted-1"
        )
        [call] = first.output
        assert call.type == "function_call"
        assert json.loads(call.arguments) == {"question": "What time is it?"}

        output: FunctionCallOutput = {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": "noon",
        }
        conn.response.create(
            model="scripted",
            tools=[TOOL],
            input=[output],
            previous_response_id=first.id,
            stream_id="main",
        )
        events = sdk_until_terminal(conn)
    final = completed(events)
    assert lanes(events) == {"main"}
    # developer + question (warm-up and turn 1), the call, its output: all kept by the server.
    expected = "You asked 'What time is it?' and the tool said 'noon'; I saw 4 items of context."
    assert final.output_text == expected
    assert streamed_text(events) == expected


@pytest.mark.anyio
async def test_starlette_socket_async_lanes(starlette: Running) -> None:
    client = starlette.async_openai()
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="scripted", input="Hi", stream_id="a")
            await conn.response.create(model="scripted", input="Hello", stream_id="b")
            events = await async_until_terminal(conn, terminals=2)
            done = {e.stream_id: e.response for e in events if e.type == "response.completed"}
            assert done["a"].output_text == "You asked 'Hi'; I saw 1 items of context."
            assert done["b"].output_text == "You asked 'Hello'; I saw 1 items of context."
            assert lanes(events) == {"a", "b"}

            await conn.response.create(
                model="scripted", input="Again", previous_response_id=done["a"].id, stream_id="a"
            )
            events = await async_until_terminal(conn)
    finally:
        await client.close()
    assert completed(events).output_text == "You asked 'Again'; I saw 3 items of context."
    assert lanes(events) == {"a"}


def test_starlette_http_streaming(starlette: Running) -> None:
    with starlette.openai() as client:
        with client.responses.create(model="scripted", input="Hi there", stream=True) as stream:
            events = list(stream)
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert events[0].type == "response.created"
        text = "You asked 'Hi there'; I saw 1 items of context."
        assert completed(events).output_text == streamed_text(events) == text

        with client.responses.create(
            model="scripted",
            input="What time is it?",
            tools=[TOOL],
            stream=True,
        ) as stream:
            events = list(stream)
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.done" in kinds
    assert completed(events).output[0].type == "function_call"


def test_starlette_http_json(starlette: Running) -> None:
    with starlette.openai() as client:
        response = client.responses.create(
            model="scripted",
            input=[
                user("What time is it?"),
                {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "noon"},
            ],
            tools=[TOOL],
        )
        assert response.status == "completed"
        assert response.output_text.endswith("the tool said 'noon'; I saw 3 items of context.")

        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="scripted", input="Hi", previous_response_id="resp_x")
    assert refused.value.status_code == 400


def test_starlette_handshake_headers_reach_every_turn(starlette: Running) -> None:
    """The handler's own auth check runs on socket turns: it sees the handshake's headers."""
    with starlette.openai(api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            client.responses.create(model="scripted", input="Hi")
        with client.responses.connect() as conn:
            conn.response.create(model="scripted", input="Hi", stream_id="s")
            [error] = sdk_until_terminal(conn)
    assert error.type == "error"
    assert error.status == 401
    assert error.stream_id == "s"
    assert error.error.message == "Incorrect API key provided."


# The Django project.


@pytest.fixture(scope="module")
def django_settings() -> Iterator[None]:
    """Django's settings, as manage.py and asgi.py set them, for this module's servers (and
    the project's database, a temporary file for this process)."""
    database_path()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(DJANGO_DIR))
        patch.setenv("DJANGO_SETTINGS_MODULE", "django_site.settings")
        yield


@pytest.fixture(scope="module", params=ALL_SERVERS)
def django_site(request: pytest.FixtureRequest, django_settings: None) -> Iterator[Running]:
    server: str = request.param
    target = "django_site.asgi:application"
    if server in PROCESS_SERVERS:
        options: dict[str, Any] = {"pythonpath": (DJANGO_DIR,)}
        app: Any = target
    else:
        import django

        django.setup()
        from django_site.asgi import application

        options, app = {}, application
    with serve(app, server, lifetime=LIFETIME, **options) as base_url:
        yield Running(server, base_url)


QUESTIONS = ["Hello there", "How are you today?", "Bye"]


def over_http(client: OpenAI) -> list[str]:
    """The conversation as a stateless HTTP client holds it: the whole context every time."""
    context: list[Any] = [DEVELOPER]
    texts = []
    for question in QUESTIONS:
        context.append(user(question))
        response = client.responses.create(model="scripted", input=context)
        context += [item.to_dict() for item in response.output]
        texts.append(response.output_text)
    return texts


@pytest.fixture(scope="module")
def expected_texts(django_site: Running) -> list[str]:
    with django_site.openai() as client:
        texts = over_http(client)
    # The developer message (5 words) and the question (2 words) are the first context.
    assert texts[0] == "You said 'Hello there'. Context: 2 items, 7 words."
    return texts


@pytest.mark.parametrize("prefix", ["", "/cached"], ids=["stateless", "cache-aware"])
def test_django_socket_sync(django_site: Running, expected_texts: list[str], prefix: str) -> None:
    """Only new items go over the socket; both views answer as if they had the whole context."""
    texts = []
    with django_site.openai(prefix) as client, client.responses.connect() as conn:
        conn.response.create(model="scripted", input=[DEVELOPER], generate=False)
        previous = completed(sdk_until_terminal(conn)).id
        for question in QUESTIONS:
            conn.response.create(
                model="scripted", input=[user(question)], previous_response_id=previous
            )
            events = sdk_until_terminal(conn)
            response = completed(events)
            assert response.previous_response_id == previous
            assert streamed_text(events) == response.output_text
            texts.append(response.output_text)
            previous = response.id
    assert texts == expected_texts


@pytest.mark.anyio
@pytest.mark.parametrize("prefix", ["", "/cached"], ids=["stateless", "cache-aware"])
async def test_django_socket_async(
    django_site: Running, expected_texts: list[str], prefix: str
) -> None:
    client = django_site.async_openai(prefix)
    texts = []
    try:
        async with client.responses.connect() as conn:
            previous: str | None = None
            for number, question in enumerate(QUESTIONS):
                new_items: ResponseInputParam = [user(question)]
                if number == 0:
                    new_items.insert(0, DEVELOPER)
                await conn.response.create(
                    model="scripted",
                    input=new_items,
                    stream_id="lane-1",
                    previous_response_id=previous or omit,
                )
                events = await async_until_terminal(conn)
                assert lanes(events) == {"lane-1"}
                previous = completed(events).id
                texts.append(completed(events).output_text)
    finally:
        await client.close()
    assert texts == expected_texts


@pytest.mark.parametrize("prefix", ["", "/cached"], ids=["stateless", "cache-aware"])
def test_django_http(django_site: Running, prefix: str) -> None:
    with django_site.openai(prefix) as client:
        with client.responses.create(model="scripted", input="Hi you", stream=True) as stream:
            events = list(stream)
        assert [event.sequence_number for event in events] == list(range(len(events)))
        text = "You said 'Hi you'. Context: 1 items, 2 words."
        assert completed(events).output_text == streamed_text(events) == text

        response = client.responses.create(model="scripted", input="Hi you")
        assert response.output_text == text

        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="scripted", input="Hi", previous_response_id="resp_x")


# The FastAPI example and the client example.


@pytest.fixture(scope="module", params=ALL_SERVERS)
def fastapi_example(request: pytest.FixtureRequest) -> Iterator[Running]:
    with serve("examples.fastapi_app:app", request.param, lifetime=LIFETIME) as base_url:
        yield Running(request.param, base_url)


def test_client_example_against_fastapi(
    fastapi_example: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = str(ROOT / "examples" / "client_sdk.py")
    arguments = ["--base-url", fastapi_example.base_url + "/v1", "What time is it?", "Thanks"]
    if fastapi_example.server == "uvicorn":
        # As a user runs it, in a new interpreter (which imports the SDK: about a second of CPU,
        # so once); under the other servers, the script run as __main__ in this process.
        command = [sys.executable, script, *arguments]
        env = {**os.environ, "OPENAI_API_KEY": "-"}
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=30, env=env, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        output = result.stdout
    else:
        monkeypatch.setenv("OPENAI_API_KEY", "-")
        monkeypatch.setattr(sys, "argv", [script, *arguments])
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(script, run_name="__main__")
        assert exited.value.code == 0
        output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].startswith("[warmed up: resp_")
    # The warm-up's developer message and each turn's new items add up on the server.
    assert lines[1:] == [
        "> What time is it?",
        "I have seen 2 item(s).",
        "> Thanks",
        "I have seen 4 item(s).",
    ]


@pytest.mark.anyio
async def test_fastapi_socket_async(fastapi_example: Running) -> None:
    client = fastapi_example.async_openai()
    try:
        async with client.responses.connect() as conn:
            await conn.response.create(model="m", input=[user("Hi"), user("there")])
            first = completed(await async_until_terminal(conn))
            await conn.response.create(model="m", input="More", previous_response_id=first.id)
            second = completed(await async_until_terminal(conn))
    finally:
        await client.close()
    assert first.output_text == "I have seen 2 item(s)."
    assert second.output_text == "I have seen 4 item(s)."
    assert second.previous_response_id == first.id


def test_fastapi_http_streaming_and_json(fastapi_example: Running) -> None:
    with fastapi_example.openai() as client:
        with client.responses.create(model="m", input=[user("Hi")], stream=True) as stream:
            events = list(stream)
        response = client.responses.create(model="m", input="Hi")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:3] == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert completed(events).output_text == streamed_text(events) == "I have seen 1 item(s)."
    assert response.output_text == "I have seen 1 item(s)."


def test_client_agent_tool_loop_and_recovery(starlette: Running) -> None:
    """The client example's agent runs tools, and recovers when its previous id is unknown."""
    from examples.client_sdk import Agent

    out = io.StringIO()
    with starlette.openai() as client, client.responses.connect() as conn:
        agent = Agent(conn, model="scripted", stream_id="agent", out=out)

        def conversation() -> tuple[str, str]:
            agent.warm_up()
            first = agent.ask("What time is it?")
            agent.last_id = "resp_unknown"  # as after a reconnect to another worker
            return first, agent.ask("And now?")

        first, second = within(15, conversation, conn.close)
    assert first.startswith("You asked 'What time is it?' and the tool said '")
    assert first.endswith("I saw 4 items of context.")
    assert second.endswith("I saw 8 items of context.")
    log = out.getvalue()
    assert log.count("[tool] get_time(") == 2
    assert "[recovering: resending the whole context]" in log
