"""Conversations over one socket: tool loops with incremental input, forks, warm-ups."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from tests.integration.apps import TOOL
from tests.integration.clients import (
    Server,
    async_until_terminal,
    call_output,
    completed_response,
    create,
    sdk_until_terminal,
)

USER = "What is six times seven?"
USER_ITEM = {"role": "user", "content": USER}
OTHER_TOOL = {**TOOL, "name": "other"}


def items(response: Any) -> list[dict[str, Any]]:
    """A response's output items as the JSON the server sent."""
    return [item.to_dict() for item in response.output]


def check_echo(events: list[Any], previous_response_id: str | None) -> None:
    """The response object of every lifecycle event echoes the client's previous id."""
    lifecycle = [e for e in events if e.type in ("response.created", "response.completed")]
    assert [e.type for e in lifecycle] == ["response.created", "response.completed"]
    for event in lifecycle:
        assert event.response.previous_response_id == previous_response_id
    assert lifecycle[0].response.id == lifecycle[1].response.id
    Response.model_validate(lifecycle[1].response.to_dict())


def run_tool_loop(server: Server, tag: str, prefix: str) -> list[Any]:
    """user -> function_call -> output -> function_call -> output -> message, sync SDK."""
    responses = []
    with server.connect(prefix) as conn:
        conn.response.create(model="scripted", input=USER, tools=[TOOL], metadata={"tag": tag})
        events = sdk_until_terminal(conn)
        check_echo(events, None)
        responses.append(completed_response(events))
        for _ in range(2):
            previous = responses[-1]
            assert previous.output[0].type == "function_call"
            conn.response.create(
                model="scripted",
                previous_response_id=previous.id,
                input=[call_output(previous.output[0])],
                tools=[TOOL],
                metadata={"tag": tag},
            )
            events = sdk_until_terminal(conn)
            check_echo(events, previous.id)
            responses.append(completed_response(events))
    assert responses[-1].output_text == "Done: received 5 items."
    return responses


def full_contexts(responses: list[Any]) -> list[list[dict[str, Any]]]:
    """The whole context of each turn of `run_tool_loop`."""
    r1, r2, _ = responses
    turn2 = [USER_ITEM, *items(r1), call_output(r1.output[0])]
    turn3 = [*turn2, *items(r2), call_output(r2.output[0])]
    return [[USER_ITEM], turn2, turn3]


def test_tool_loop_always_gives_the_handler_the_full_context(server: Server, tag: str) -> None:
    responses = run_tool_loop(server, tag, "")
    calls = server.recorder.for_tag(tag)
    assert len(calls) == 3
    contexts = full_contexts(responses)
    assert calls[0].body["input"] == USER  # a fresh chain forwards the input as sent
    for call, context, previous in zip(calls[1:], contexts[1:], responses[:2], strict=True):
        assert call.body["input"] == context
        assert "previous_response_id" not in call.body  # the drop-in handler is stateless
        assert call.body["stream"] is True
        assert {"type", "stream_id", "generate"}.isdisjoint(call.body)
        assert call.turn is not None
        assert call.turn["previous_id"] == previous.id
        assert call.turn["history"] == context
    # Artifacts written on turn N are on turn N+1's `previous`.
    assert [call.turn["previous_artifacts"] for call in calls] == [
        None,
        {"turn_no": 1, "tag": tag},
        {"turn_no": 2, "tag": tag},
    ]


def test_tool_loop_on_miss_gives_only_the_new_items(server: Server, tag: str) -> None:
    responses = run_tool_loop(server, tag, "/onmiss")
    calls = server.recorder.for_tag(tag)
    assert len(calls) == 3
    contexts = full_contexts(responses)
    assert calls[0].body["input"] == USER
    assert "previous_response_id" not in calls[0].body
    assert calls[0].turn is not None
    assert calls[0].turn["previous_id"] is None
    assert calls[0].turn["tools_changed"] is True
    for call, context, previous in zip(calls[1:], contexts[1:], responses[:2], strict=True):
        new = [call_output(previous.output[0])]
        assert call.body["input"] == new
        assert call.body["previous_response_id"] == previous.id
        assert call.turn["new_input"] == new
        assert call.turn["history"] == context
        assert call.turn["previous_id"] == previous.id
        assert call.turn["tools_changed"] is False
    assert calls[1].turn["previous_artifacts"] == {"turn_no": 1, "tag": tag}
    assert calls[2].turn["previous_artifacts"] == {"turn_no": 2, "tag": tag}


@pytest.mark.anyio
async def test_tool_loop_async_sdk_on_miss_tools_changed(server: Server, tag: str) -> None:
    async with (
        server.async_openai("/onmiss") as client,
        client.responses.connect() as conn,
    ):
        await conn.response.create(
            model="scripted", input=USER, tools=[TOOL], metadata={"tag": tag, "k": "1"}
        )
        r1 = completed_response(await async_until_terminal(conn))
        await conn.response.create(
            model="scripted",
            previous_response_id=r1.id,
            input=[call_output(r1.output[0])],
            tools=[TOOL],
            metadata={"tag": tag, "k": "1"},
        )
        events = await async_until_terminal(conn)
        r2 = completed_response(events)
        assert events[0].response.previous_response_id == r1.id
        assert r2.previous_response_id == r1.id
        assert r2.output_text == "Done: received 3 items."
        # Same tools in another order of keys: unchanged. Other tools: changed.
        reordered = dict(reversed(list(TOOL.items())))
        await conn.response.create(
            model="scripted",
            previous_response_id=r2.id,
            input="And now?",
            tools=[reordered],
            metadata={"tag": tag, "k": "1"},
        )
        r3 = completed_response(await async_until_terminal(conn))
        await conn.response.create(
            model="scripted",
            previous_response_id=r3.id,
            input=[call_output(r3.output[0])],
            tools=[TOOL, OTHER_TOOL],
            metadata={"tag": tag, "k": "1"},
        )
        r4 = completed_response(await async_until_terminal(conn))
        assert r4.output_text == "Done: received 7 items."
    calls = server.recorder.for_tag(tag)
    assert [call.turn["tools_changed"] for call in calls] == [True, False, False, True]
    assert calls[3].turn["history"] == [
        USER_ITEM,
        *items(r1),
        call_output(r1.output[0]),
        *items(r2),
        {"role": "user", "content": "And now?"},
        *items(r3),
        call_output(r3.output[0]),
    ]
    assert [call.turn["previous_artifacts"]["turn_no"] for call in calls[1:]] == [1, 2, 3]


@pytest.mark.parametrize("prefix", ["", "/onmiss"])
def test_fresh_request_never_inherits_history(server: Server, tag: str, prefix: str) -> None:
    with server.raw(prefix) as ws:
        for stream_id in (None, "lane"):
            lane = {"stream_id": stream_id} if stream_id else {}
            ws.send(create(tag, input=USER, tools=[TOOL], **lane))
            first = completed_response(ws.until_terminal())
            ws.send(
                create(
                    tag,
                    input=[call_output(first["output"][0])],
                    previous_response_id=first["id"],
                    **lane,
                )
            )
            completed_response(ws.until_terminal())
            # The lane has a history now; a create without previous_response_id ignores it.
            ws.send(create(tag, input="A new topic.", meta={"k": "0"}, **lane))
            events = ws.until_terminal()
            fresh = completed_response(events)
            assert fresh["previous_response_id"] is None
            assert fresh["output"][0]["content"][0]["text"] == "Done: received 1 items."
    calls = server.recorder.for_tag(tag)
    assert len(calls) == 6
    for call in (calls[2], calls[5]):
        assert call.body["input"] == "A new topic."
        assert "previous_response_id" not in call.body
        assert call.turn["previous_id"] is None
        assert call.turn["history"] == [{"role": "user", "content": "A new topic."}]


def test_forks_continue_from_older_responses(server: Server, tag: str) -> None:
    with server.connect() as conn:

        def turn(k: str = "2", **fields: Any) -> Any:
            conn.response.create(
                model="scripted", tools=[TOOL], metadata={"tag": tag, "k": k}, **fields
            )
            return completed_response(sdk_until_terminal(conn))

        r1 = turn(input=USER)
        r2 = turn(previous_response_id=r1.id, input=[call_output(r1.output[0], "first")])
        r3 = turn(previous_response_id=r2.id, input=[call_output(r2.output[0], "second")])
        assert r3.output_text == "Done: received 5 items."
        # Back to r1 (not the latest) with another tool result: that branch's context only.
        fork1 = turn(previous_response_id=r1.id, input=[call_output(r1.output[0], "other")])
        assert fork1.output[0].type == "function_call"
        fork2 = turn(previous_response_id=r2.id, input=[call_output(r2.output[0], "again")])
        assert fork2.output_text == "Done: received 5 items."
        # The original chain is still whole after the forks.
        r4 = turn(previous_response_id=r3.id, input="Thanks.", k="0")
        assert r4.output_text == "Done: received 7 items."
    calls = server.recorder.for_tag(tag)
    assert calls[3].body["input"] == [USER_ITEM, *items(r1), call_output(r1.output[0], "other")]
    assert calls[4].body["input"] == [
        USER_ITEM,
        *items(r1),
        call_output(r1.output[0], "first"),
        *items(r2),
        call_output(r2.output[0], "again"),
    ]
    assert calls[5].body["input"][:5] == calls[2].body["input"]


@pytest.mark.parametrize("prefix", ["", "/onmiss"])
def test_warm_up_prepares_state_without_calling_the_handler(
    server: Server, tag: str, prefix: str
) -> None:
    with server.connect(prefix) as conn:
        conn.send(
            {
                "type": "response.create",
                "model": "scripted",
                "input": "Warm up.",
                "instructions": "Be terse.",
                "tools": [TOOL],
                "metadata": {"tag": tag},
                "generate": False,
            }
        )
        events = sdk_until_terminal(conn)
        assert [event.type for event in events] == ["response.created", "response.completed"]
        warm = events[1].response
        assert events[0].response.id == warm.id
        assert warm.status == "completed"
        assert warm.output == []
        assert server.recorder.for_tag(tag) == []

        conn.response.create(
            model="scripted",
            previous_response_id=warm.id,
            input="Go.",
            tools=[TOOL],
            metadata={"tag": tag, "k": "0"},
        )
        events = sdk_until_terminal(conn)
        assert events[0].type == "response.created"
        check_echo(events, warm.id)
        assert completed_response(events).output_text == "Done: received 2 items."
    [call] = server.recorder.for_tag(tag)
    context = [{"role": "user", "content": "Warm up."}, {"role": "user", "content": "Go."}]
    assert call.turn["previous_id"] == warm.id
    assert call.turn["history"] == context
    assert call.turn["tools_changed"] is False  # the warm-up prepared the same tools
    assert "instructions" not in call.body  # not carried over from the parent
    if prefix:
        assert call.body["input"] == "Go."
        assert call.body["previous_response_id"] == warm.id
    else:
        assert call.body["input"] == context


def test_prompt_cache_prewarm_with_the_sdks_typed_fields_is_a_warm_up(
    server: Server, tag: str
) -> None:
    """`generate` and `prompt_cache_options` as the SDK's typed create takes them: a prewarm
    overrides `generate: true` (the SDKs say so) and no handler runs; `generate: true` alone
    generates."""
    with server.connect() as conn:
        conn.response.create(
            model="scripted",
            input="Warm up.",
            generate=True,
            prompt_cache_options={"prewarm": True, "ttl": "30m"},
            metadata={"tag": tag},
        )
        events = sdk_until_terminal(conn)
        assert [event.type for event in events] == ["response.created", "response.completed"]
        warm = events[1].response
        assert warm.output == []
        assert server.recorder.for_tag(tag) == []
        conn.response.create(
            model="scripted",
            previous_response_id=warm.id,
            input="Go.",
            generate=True,
            metadata={"tag": tag, "k": "0"},
        )
        assert completed_response(sdk_until_terminal(conn)).output_text
    [call] = server.recorder.for_tag(tag)
    assert call.turn["previous_id"] == warm.id


def test_warm_up_on_a_lane_carries_its_stream_id(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="Warm up.", generate=False, stream_id="w"))
        events = ws.until_terminal()
        assert [e["type"] for e in events] == ["response.created", "response.completed"]
        assert all(e["stream_id"] == "w" for e in events)
        warm = Response.model_validate(events[1]["response"])
        ws.send(create(tag, input="Go.", previous_response_id=warm.id, stream_id="w2"))
        events = ws.until_terminal()
        assert all(e["stream_id"] == "w2" for e in events)
        assert completed_response(events)["previous_response_id"] == warm.id
    [call] = server.recorder.for_tag(tag)
    assert call.body["input"][0] == {"role": "user", "content": "Warm up."}


@pytest.mark.parametrize("omit_output", [False, True], ids=["output", "items-only"])
def test_every_output_item_type_is_kept_in_the_context(
    server: Server, tag: str, omit_output: bool
) -> None:
    meta = {"omit_output": "1"} if omit_output else {}
    with server.raw() as ws:
        ws.send(create(tag, "multi-item", input=USER, meta=meta))
        events = ws.until_terminal()
        response = completed_response(events)
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [item["type"] for item in done] == ["reasoning", "message"]
        assert response["output"] == ([] if omit_output else done)
        ws.send(create(tag, input="Next.", previous_response_id=response["id"], meta={"k": "0"}))
        completed_response(ws.until_terminal())
    calls = server.recorder.for_tag(tag)
    assert calls[1].body["input"] == [USER_ITEM, *done, {"role": "user", "content": "Next."}]
    assert calls[1].body["input"][1]["encrypted_content"] == done[0]["encrypted_content"]
