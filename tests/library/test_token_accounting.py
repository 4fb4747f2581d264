"""The tokens a socket carried, counted once each and the same everywhere: a conversation with
tool calls and an interrupted turn, over a real socket (uvicorn on loopback, a `websockets`
client) to the reference server, counts in `Stats`, in the Prometheus scrape, on the turns'
spans and in the billing recipe of docs/operations.md (run as written) exactly the sum of the
`usage` the client received; and that sum is what the same conversation reports over plain
HTTP (the openai SDK, the client keeping the history).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
import openai
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.library.test_interrupt import USAGE, Scripted, interrupt, read_until, start
from tests.library.test_stats import assert_json_safe
from tests.servers import serve
from ws_mode import AuthenticationFailed, WebSocketModeMiddleware, bearer_token, find_middlewares
from ws_mode._asgi import ASGIApp, Message, Receive, Scope, Send
from ws_mode._stats import TOKEN_KINDS, Stats
from ws_mode._tap import Usage
from ws_mode.prometheus import with_metrics
from ws_mode.toolkit.agent import DEFAULT_INSTRUCTIONS, DEFAULT_TOOLS
from ws_mode.toolkit.reference import ReferenceConfig, create_app

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
RECV = 10.0
MODEL = "reference-1"
#: One tool call before each answer, short answers: a conversation of a few turns.
CONFIG = ReferenceConfig(tool_calls=1, answer_tokens=12)
KEYS = {"sk-team-a": "team-a", "sk-team-b": "team-b"}
FIELDS = {"model": MODEL, "instructions": DEFAULT_INSTRUCTIONS, "tools": list(DEFAULT_TOOLS)}
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
#: How the kinds of `TOKEN_KINDS` are read from a `usage`.
KIND_PATHS = {
    "input": ("input_tokens",),
    "cached_input": ("input_tokens_details", "cached_tokens"),
    "output": ("output_tokens",),
    "reasoning": ("output_tokens_details", "reasoning_tokens"),
}
SPAN_NAMES = {
    "input": "gen_ai.usage.input_tokens",
    "cached_input": "gen_ai.usage.cache_read.input_tokens",
    "output": "gen_ai.usage.output_tokens",
    "reasoning": "gen_ai.usage.reasoning.output_tokens",
}


def recipe() -> str:
    """The billing recipe's code block, as docs/operations.md shows it."""
    page = OPERATIONS.read_text(encoding="utf-8")
    start = page.index("### Billing tokens per caller\n")
    [code] = re.findall(r"^```python\n(.*?)^```", page[start : page.index("\n## ", start)],
                        re.MULTILINE | re.DOTALL)  # fmt: skip
    return str(code)


def counts(usage: Any) -> Counter[str]:
    """A `usage` object's tokens by kind (none for a null usage)."""
    found: Counter[str] = Counter()
    if not isinstance(usage, dict):
        return found
    for kind, path in KIND_PATHS.items():
        value: Any = usage
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        found[kind] = value if isinstance(value, int) else 0
    return found


def total(usages: list[Any]) -> dict[str, int]:
    summed: Counter[str] = Counter()
    for usage in usages:
        summed.update(counts(usage))
    return {kind: summed[kind] for kind in TOKEN_KINDS}


class Held:
    """The reference server with the answer to a request whose metadata says `hold` held after
    `response.in_progress` until the client goes (an interrupt, or an HTTP client closing its
    stream): the time to interrupt a response that is running."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = [await receive()]
        while chunks[-1].get("more_body"):
            chunks.append(await receive())
        body = b"".join(chunk.get("body", b"") for chunk in chunks)
        held = b'"hold"' in body

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        async def held_send(message: Message) -> None:
            data = message.get("body", b"")
            if held and message["type"] == "http.response.body" and b"in_progress" in data:
                end = data.index(b"\n\n", data.index(b"response.in_progress")) + 2
                await send({**message, "body": data[:end], "more_body": True})
                await anyio.sleep(3600)  # cancelled when the client goes
                message = {**message, "body": data[end:]}
            await send(message)

        await self.app(scope, replay, held_send)


async def authenticate(scope: Scope) -> str:
    key = bearer_token(scope)
    if key not in KEYS:
        raise AuthenticationFailed()
    return KEYS[key]


def read_turn(ws: ClientConnection, seen: list[dict[str, Any]]) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(ws.recv(RECV))
        seen.append(event)
        if event["type"] in TERMINAL:
            return event


def socket_turn(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    """One turn: the terminal event's response."""
    ws.send(json.dumps({"type": "response.create", **FIELDS, **fields}))
    terminal = read_turn(ws, [])
    assert terminal["type"] in {"response.completed", "response.incomplete"}, terminal
    response: dict[str, Any] = terminal["response"]
    return response


def interrupted_turn(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    """A turn interrupted while it runs: its `response.incomplete`'s response."""
    ws.send(json.dumps({"type": "response.create", **FIELDS, **fields}))
    event: dict[str, Any] = json.loads(ws.recv(RECV))
    assert event["type"] == "response.created"
    ws.send(json.dumps({"type": "response.interrupt", "response_id": event["response"]["id"]}))
    terminal = read_turn(ws, [])
    assert terminal["type"] == "response.incomplete"
    response: dict[str, Any] = terminal["response"]
    assert response["incomplete_details"] == {"reason": "interrupted"}
    return response


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def answer_call(response: dict[str, Any]) -> dict[str, Any]:
    [call] = [item for item in response["output"] if item["type"] == "function_call"]
    return {"type": "function_call_output", "call_id": call["call_id"], "output": "lines 1-40"}


def over_the_socket(url: str, key: str, *, interrupt: bool) -> dict[str, dict[str, Any]]:
    """The conversation: a question (a tool call, its output, the answer), a follow-up that is
    interrupted (with `interrupt`), another follow-up from the answer (a tool call, its output,
    the answer). The terminal responses the client received, by turn."""
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        turns = {"first": socket_turn(ws, input=[user("Where is the configuration loaded?")])}
        first = turns["first"]
        turns["answered"] = socket_turn(
            ws, previous_response_id=first["id"], input=[answer_call(first)]
        )
        answered = turns["answered"]["id"]
        if interrupt:
            held = {"hold": "1"}
            turns["cut"] = interrupted_turn(
                ws, previous_response_id=answered, input=[user("Why?")], metadata=held
            )
        turns["again"] = again = socket_turn(
            ws, previous_response_id=answered, input=[user("And how?")]
        )
        turns["last"] = socket_turn(
            ws, previous_response_id=again["id"], input=[answer_call(again)]
        )
    return turns


def over_http(base: str, socket: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The same conversation over plain HTTP, the client sending the whole history: the
    terminal responses by turn (None for the turn the client abandoned, as it interrupted it).
    The history is the one the socket's client had (its tool calls' ids are random), so each
    turn reads the very context its socket turn read."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-http", max_retries=0)

    def create(history: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        response = client.responses.create(**FIELDS, input=history, **extra)  # type: ignore[call-overload]
        dumped: dict[str, Any] = response.model_dump(mode="json")
        return dumped

    history = [user("Where is the configuration loaded?")]
    over: dict[str, dict[str, Any] | None] = {"first": create(history)}
    history += [*socket["first"]["output"], answer_call(socket["first"])]
    over["answered"] = create(history)
    history += socket["answered"]["output"]
    if "cut" in socket:
        with client.responses.create(  # type: ignore[call-overload]
            **FIELDS, input=[*history, user("Why?")], metadata={"hold": "1"}, stream=True
        ) as stream:
            for event in stream:
                assert event.type != "response.completed"
                if event.type == "response.in_progress":
                    break  # the client leaves: it hears no usage
        over["cut"] = None
    history += [user("And how?")]
    over["again"] = create(history)
    history += [*socket["again"]["output"], answer_call(socket["again"])]
    over["last"] = create(history)
    return over


def until(condition: Callable[[], bool]) -> None:
    # A deadline that catches a hang, not a speed: `on_response` runs after the terminal event.
    deadline = time.monotonic() + RECV
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def scraped(text: str, name: str) -> dict[tuple[str, str], float]:
    """The `ws_mode_tokens_total` samples of the middleware called `name`, by model and kind."""
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "ws_mode_tokens"]
    return {
        (sample.labels["model"], sample.labels["kind"]): sample.value
        for sample in family.samples
        if sample.labels["middleware"] == name
    }


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_the_tokens_counted_over_the_socket_are_those_the_client_received_and_those_of_http(
    full_context: str,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(CONFIG)
    app.add_middleware(Held)  # under the middleware: socket turns meet it
    namespace: dict[str, Any] = {"app": app, "authenticate": authenticate}
    exec(recipe(), namespace)  # the recipe as docs/operations.md gives it
    billed = namespace["billed"]
    [added] = [each for each in app.user_middleware if each.cls is not Held]
    added.kwargs["tracer_provider"] = provider  # this test's spans, not the process's
    # `on_miss`: continuations reach the reference with their new input only, and it hands its
    # events to ws_mode as objects (its cache-aware path), all at once: nothing to interrupt.
    added.kwargs["full_context"] = full_context
    interrupt = full_context == "always"
    [middleware] = find_middlewares(app)
    middleware.stats.name = "token-accounting"
    served = with_metrics(app, registry=CollectorRegistry())

    with serve(served) as base:
        url = base.replace("http", "ws") + "/v1/responses"
        by_turn = over_the_socket(url, "sk-team-a", interrupt=interrupt)
        team_b = [socket_turn_alone(url, "sk-team-b")]
        # A turn's tokens are counted as its lane moves on, around its terminal event's send.
        turns = len(by_turn) + len(team_b)
        until(lambda: middleware.stats.turns == turns and not middleware.stats.connections_open)
        scrape = httpx.get(f"{base}/metrics", timeout=RECV).text
    with serve(Held(create_app(CONFIG))) as plain:
        http = over_http(plain, by_turn)

    # `on_miss`: the continuations took the reference's cache-aware path (resumed contexts).
    assert (app.state.reference_stats.resumed > 0) is (full_context == "on_miss")
    team_a = list(by_turn.values())
    usages_a = [response["usage"] for response in team_a]
    if interrupt:
        assert by_turn["cut"]["usage"] is None  # the reference reports usage at the end only
    assert all(counts(by_turn[name]["usage"])["input"] > 0 for name in by_turn if name != "cut")
    received = total(usages_a + [response["usage"] for response in team_b])

    # Over plain HTTP the same turns report the same usage: the same contexts, the same tokens.
    assert {name: counts(r["usage"]) if r else None for name, r in http.items()} == {
        name: counts(r["usage"]) if name != "cut" else None for name, r in by_turn.items()
    }
    assert total([r["usage"] for r in http.values() if r is not None]) == total(usages_a)

    # Stats, the scrape: what the clients received, under the model the responses name.
    snapshot = middleware.stats.snapshot()["tokens"]
    assert {kind: snapshot[kind] for kind in TOKEN_KINDS} == received
    assert snapshot["by_model"] == {MODEL: received}
    assert all(response["model"] == MODEL for response in team_a)
    assert scraped(scrape, "token-accounting") == {
        (MODEL, kind): float(count) for kind, count in received.items()
    }

    # The billing recipe: each principal what its own client received.
    until(lambda: sum(billed["team-b"].values()) > 0)
    until(lambda: dict(billed["team-a"]) == total(usages_a))
    assert {kind: billed["team-b"][kind] for kind in TOKEN_KINDS} == total(
        [response["usage"] for response in team_b]
    )

    # The turns' spans: the usage of each response, its model and id; none for the interrupted.
    spans = [span for span in exporter.get_finished_spans() if span.name == "response.create"]
    by_id = {span.attributes["gen_ai.response.id"]: span.attributes for span in spans}
    for response in team_a + team_b:
        attributes = by_id[response["id"]]
        assert attributes["gen_ai.response.model"] == MODEL
        if response["usage"] is None:
            assert not any(name in attributes for name in SPAN_NAMES.values())
            assert attributes["ws_mode.interrupted"] is True
        else:
            assert {kind: attributes[name] for kind, name in SPAN_NAMES.items()} == counts(
                response["usage"]
            )
            # The share of its input read from the prompt cache, when it had input.
            used = response["usage"]
            ratio = used["input_tokens_details"]["cached_tokens"] / used["input_tokens"]
            assert attributes["ws_mode.prompt_cache_ratio"] == ratio


def socket_turn_alone(url: str, key: str) -> dict[str, Any]:
    """Another caller's one turn, on a socket of its own."""
    with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        return socket_turn(ws, input=[user("Hello")])


def test_an_interrupted_response_counts_the_usage_reported_before_the_interrupt() -> None:
    # A handler that reports usage as it goes (`response.in_progress`): the interrupted
    # response's `response.incomplete` carries the latest, and that is what is counted.
    handler = Scripted()
    billed: list[dict[str, Any]] = []

    async def bill(turn: Any, response: dict[str, Any]) -> None:
        billed.append(response)

    middleware = WebSocketModeMiddleware(handler, on_response=bill)
    with serve(middleware) as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        target, _ = start(ws, "slow")
        ws.send(interrupt(target))
        terminal = read_until(ws, TERMINAL, [])
        until(lambda: len(billed) == 1 and middleware.stats.snapshot()["tokens"]["input"] > 0)
    assert terminal["type"] == "response.incomplete"
    assert terminal["response"]["usage"] == USAGE
    tokens = middleware.stats.snapshot()["tokens"]
    assert (tokens["input"], tokens["output"]) == (USAGE["input_tokens"], USAGE["output_tokens"])
    assert billed[0]["usage"] == USAGE  # the recipe's hook bills it too


def test_a_failed_response_counts_its_usage_under_the_model_it_names_and_is_billed() -> None:
    usage = {"input_tokens": 500, "input_tokens_details": {"cached_tokens": 384},
             "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip

    async def failing(request: Request) -> JSONResponse:
        return JSONResponse({
            "id": "resp_failed_1", "object": "response", "status": "failed",
            "model": "served-2026-01-01", "output": [], "usage": usage,
            "error": {"code": "server_error", "message": "The model failed."},
        })  # fmt: skip

    billed: list[dict[str, Any]] = []

    async def bill(turn: Any, response: dict[str, Any]) -> None:
        billed.append(response)

    app = Starlette(routes=[Route("/v1/responses", failing, methods=["POST"])])
    middleware = WebSocketModeMiddleware(app, on_response=bill)
    with serve(middleware) as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "served", "input": "hi"}))
        terminal = read_turn(ws, [])
        until(lambda: bool(middleware.stats.snapshot()["tokens"]["by_model"]) and bool(billed))
    assert terminal["type"] == "response.failed"
    # The billing recipe's hook sees the failed response too: its usage is billed.
    assert [(r["id"], r["status"], r["usage"]) for r in billed] == [
        ("resp_failed_1", "failed", usage)
    ]
    tokens = middleware.stats.snapshot()["tokens"]
    # The model the response names, not the request's `served`.
    assert tokens["by_model"] == {
        "served-2026-01-01": {"input": 500, "cached_input": 384, "output": 0, "reasoning": 0}
    }


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        (None, None),
        ("12", None),
        ({}, Usage(0, 0, 0, 0)),
        ({"input_tokens": 9, "output_tokens": 4}, Usage(9, 0, 4, 0)),
        (
            {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 8},
             "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 3}},
            Usage(9, 8, 4, 3),
        ),
        # What is no count counts 0: negative, a float, a bool, a string, past JSON's integers.
        (
            {"input_tokens": -1, "input_tokens_details": {"cached_tokens": 1.5},
             "output_tokens": True, "output_tokens_details": "3"},
            Usage(0, 0, 0, 0),
        ),
        ({"input_tokens": 2**64, "output_tokens": 2**53}, Usage(0, 0, 2**53, 0)),
    ],
)  # fmt: skip
def test_a_usage_is_read_as_counts_and_nonsense_counts_nothing(
    usage: Any, read: Usage | None
) -> None:
    assert Usage.of({"usage": usage}) == read
    stats = Stats()
    if read is not None:
        stats.count_tokens("m", read)
    assert_json_safe(stats.snapshot())


# --- the billing recipe against usage as handlers and upstreams really send it ---------------

#: A token count as handlers and upstreams send it: an integer (negative, past 2^53 too), or
#: none at all (`null`, which real servers send for `cached_tokens`), a string, a float
#: (`1e300`), a bool, a list.
ODD_COUNTS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.just(2**53),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.just("12"),
    st.sampled_from([1e300, -1e300, 1.5, 12.0, -0.0]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
)


def odd_details(key: str) -> st.SearchStrategy[Any]:
    """A `usage`'s `..._details`: an object that may hold its count, or anything else."""
    return st.one_of(
        st.fixed_dictionaries({}, optional={key: ODD_COUNTS}),
        st.none(),
        st.just("details"),
        st.lists(st.integers(), max_size=2),
    )


#: A response object with no `usage` at all.
NO_USAGE: Final = "no usage"
#: A response's `usage` as it may come: absent, null, no object, or an object whose counts
#: and details are any of the above.
ODD_USAGES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "input_tokens": ODD_COUNTS,
            "input_tokens_details": odd_details("cached_tokens"),
            "output_tokens": ODD_COUNTS,
            "output_tokens_details": odd_details("reasoning_tokens"),
            "total_tokens": ODD_COUNTS,
        },
    ),
    st.none(),
    st.just("usage"),
    st.just(NO_USAGE),
)

#: `"cached_tokens": null`, as real servers send it.
NULL_CACHED: Final = {
    "input_tokens": 30,
    "input_tokens_details": {"cached_tokens": None},
    "output_tokens": 15,
    "output_tokens_details": {"reasoning_tokens": 0},
}
#: A string, `1e300`, a negative number and a bool: each counts 0.
ODDITIES: Final = {
    "input_tokens": "30",
    "input_tokens_details": {"cached_tokens": 1e300},
    "output_tokens": -15,
    "output_tokens_details": {"reasoning_tokens": True},
}

#: One turn the handler answers: its usage, the response's status, streamed (SSE) or not.
ODD_TURNS = st.tuples(
    ODD_USAGES, st.sampled_from(["completed", "incomplete", "failed"]), st.booleans()
)


class OddUsage:
    """A handler answering each request with the usage, status and form the test set for its
    `input` (`script`): a JSON response object, or the SSE stream of one."""

    def __init__(self) -> None:
        self.script: dict[str, tuple[Any, str, bool]] = {}
        self.numbers = itertools.count()

    async def answer(self, request: Request) -> Response:
        body = await request.json()
        [item] = body["input"]
        usage, status, streamed = self.script[item["content"]]
        response: dict[str, Any] = {
            "id": f"resp_{next(self.numbers)}", "object": "response", "status": status,
            "model": MODEL, "output": [],
        }  # fmt: skip
        if usage != NO_USAGE:
            response["usage"] = usage
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        if status == "failed":
            response["error"] = {"code": "server_error", "message": "The model failed."}
        if not streamed:
            return Response(json.dumps(response), media_type="application/json")
        started = {**response, "status": "in_progress", "usage": None}
        events = [("response.created", started), (f"response.{status}", response)]
        stream = "".join(
            f"event: {kind}\ndata: {json.dumps({'type': kind, 'response': data})}\n\n"
            for kind, data in events
        )
        return Response(stream, media_type="text/event-stream")


def test_the_billing_recipe_bills_exactly_what_the_metrics_count_whatever_the_usage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    handler = OddUsage()
    app = Starlette(routes=[Route("/v1/responses", handler.answer, methods=["POST"])])
    namespace: dict[str, Any] = {"app": app, "authenticate": authenticate}
    exec(recipe(), namespace)  # the recipe as docs/operations.md gives it
    billed: dict[str, Counter[str]] = namespace["billed"]
    bill = namespace["bill"]
    called = [0]

    async def bill_counting_calls(turn: Any, response: dict[str, Any]) -> None:
        # The recipe's hook, and how many times it ran (raising or not).
        try:
            await bill(turn, response)
        finally:
            called[0] += 1

    [entry] = app.user_middleware
    entry.kwargs["on_response"] = bill_counting_calls
    [middleware] = find_middlewares(app)
    middleware.stats.name = "odd-usage"
    served = with_metrics(app, registry=CollectorRegistry())
    sent = itertools.count(1)
    turns = [0]

    def metrics() -> dict[str, int]:
        tokens = middleware.stats.snapshot()["tokens"]
        return {kind: tokens[kind] for kind in TOKEN_KINDS}

    def billed_totals() -> dict[str, int]:
        return {kind: sum(billed[who][kind] for who in billed) for kind in TOKEN_KINDS}

    caplog.set_level(logging.INFO, logger="ws_mode")
    with (
        serve(served) as base,
        connect(
            base.replace("http", "ws") + "/v1/responses",
            additional_headers={"Authorization": "Bearer sk-team-a"},
        ) as ws,
    ):

        @settings(max_examples=40)
        @given(st.lists(ODD_TURNS, min_size=1, max_size=3))
        # `"cached_tokens": null`, as real servers send it: the old recipe billed the input
        # (30), raised before the output (15), and logged a traceback.
        @example([(NULL_CACHED, "completed", True)])
        @example([(ODDITIES, "completed", False), (ODDITIES, "failed", True)])
        def bill_turns(script: list[tuple[Any, str, bool]]) -> None:
            # What this example adds, so that a failing example fails alone (and shrinks).
            counted_before, billed_before = metrics(), billed_totals()
            for usage, status, streamed in script:
                text = f"turn-{next(sent)}"
                handler.script[text] = (usage, status, streamed)
                ws.send(json.dumps({"type": "response.create", **FIELDS, "input": [user(text)]}))
                terminal = read_turn(ws, [])
                assert terminal["type"] == f"response.{status}", terminal
                turns[0] += 1
            until(lambda: called[0] == turns[0])  # the hook ran for every response
            counted_now, billed_now = metrics(), billed_totals()
            assert {kind: billed_now[kind] - billed_before[kind] for kind in TOKEN_KINDS} == {
                kind: counted_now[kind] - counted_before[kind] for kind in TOKEN_KINDS
            }

        bill_turns()
        scrape = httpx.get(f"{base}/metrics", timeout=RECV).text
    assert turns[0] > 0
    # The metrics over HTTP say what Stats says: the billed totals.
    assert scraped(scrape, "odd-usage") == {
        (MODEL, kind): float(count) for kind, count in billed_totals().items()
    }
    # The hook never raised: no traceback, no failed post-response work.
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failures == [], [r.getMessage() for r in failures]
