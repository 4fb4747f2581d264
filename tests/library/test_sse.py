"""Tests of the incremental `text/event-stream` decoder."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ws_mode._sse import SSEBlock, SSEBlocks, SSEDecoder, SSEEvent, encode_sse


def decode(*chunks: bytes) -> list[SSEEvent]:
    """Feed `chunks` one by one to a fresh decoder; return every event they completed."""
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events


def bytewise(body: bytes) -> list[SSEEvent]:
    """Feed `body` one byte at a time."""
    return decode(*(body[index : index + 1] for index in range(len(body))))


# --- hand-written cases ----------------------------------------------------------------------


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_line_endings(newline: bytes) -> None:
    body = newline.join([b"event: one", b"data: 1", b"", b"data: 2", b"", b""])
    expected = [("one", b"1"), (None, b"2")]
    assert decode(body) == expected
    assert bytewise(body) == expected


def test_mixed_line_endings_in_one_event() -> None:
    body = b"event: mixed\rdata: a\r\ndata: b\ndata: c\r\r\n"
    assert decode(body) == [("mixed", b"a\nb\nc")]


def test_multi_line_data_joined_with_lf() -> None:
    body = b"data: first\ndata: second\ndata:third\n\n"
    assert decode(body) == [(None, b"first\nsecond\nthird")]


def test_event_field_names_the_event() -> None:
    assert decode(b"event: response.created\ndata: {}\n\n") == [("response.created", b"{}")]


def test_event_field_is_reset_after_dispatch() -> None:
    body = b"event: a\ndata: 1\n\ndata: 2\n\n"
    assert decode(body) == [("a", b"1"), (None, b"2")]


def test_last_event_field_wins() -> None:
    assert decode(b"event: a\nevent: b\ndata: x\n\n") == [("b", b"x")]


def test_comments_are_ignored() -> None:
    body = b": keep-alive\ndata: a\n:another comment\ndata: b\n\n: trailing\n\n"
    assert decode(body) == [(None, b"a\nb")]


def test_comment_alone_is_not_an_event() -> None:
    assert decode(b": ping\n\n: ping\n\n") == []


def test_id_and_retry_are_ignored() -> None:
    body = b"id: 7\nretry: 1000\nevent: x\ndata: y\nid\n\n"
    assert decode(body) == [("x", b"y")]


def test_unknown_fields_are_ignored() -> None:
    assert decode(b"foo: bar\ndata: y\nDATA: z\n\n") == [(None, b"y")]


def test_field_without_colon_has_an_empty_value() -> None:
    assert decode(b"data\ndata\n\n") == [(None, b"\n")]
    assert decode(b"data\n\n") == [(None, b"")]
    assert decode(b"event\ndata: x\n\n") == [(None, b"x")]


def test_only_one_leading_space_is_stripped() -> None:
    body = b"event:  two\ndata:  spaced\ndata:none\ndata:\tTab\n\n"
    assert decode(body) == [(" two", b" spaced\nnone\n\tTab")]


def test_colon_in_value_is_kept() -> None:
    assert decode(b'data: {"a": "b:c"}\n\n') == [(None, b'{"a": "b:c"}')]


def test_blank_line_dispatches_each_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\n") == []
    assert decoder.feed(b"\n") == [(None, b"1")]
    assert decoder.feed(b"data: 2\n") == []
    assert decoder.feed(b"\ndata: 3\n\n") == [(None, b"2"), (None, b"3")]


def test_event_without_data_is_not_dispatched() -> None:
    body = b"event: lonely\n\ndata: x\n\n"
    # The unused `event:` is discarded with the empty event: it does not leak into the next.
    assert decode(body) == [(None, b"x")]


def test_repeated_blank_lines_dispatch_nothing_more() -> None:
    assert decode(b"\n\n\ndata: x\n\n\n\n") == [(None, b"x")]


def test_empty_data_line_is_an_event() -> None:
    assert decode(b"data:\n\n") == [(None, b"")]
    assert decode(b"data: \n\n") == [(None, b"")]


def test_leading_bom_is_stripped() -> None:
    body = b"\xef\xbb\xbfdata: x\n\n"
    assert decode(body) == [(None, b"x")]
    assert bytewise(body) == [(None, b"x")]
    assert decode(b"\xef", b"\xbb", b"\xbf", b"event: e\n", b"data: y\n\n") == [("e", b"y")]


def test_bom_only_stripped_at_the_start() -> None:
    # A second BOM is part of the line: it makes the field name unknown.
    assert decode(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\ndata: y\n\n") == [(None, b"y")]
    # A BOM later in the stream is ordinary data.
    assert decode(b"data: \xef\xbb\xbfz\n\n") == [(None, b"\xef\xbb\xbfz")]


def test_partial_bom_prefix_that_is_not_a_bom() -> None:
    assert decode(b"\xef", b"\xbbdata: x\n\n") == []
    assert decode(b"\xef\xbb", b"xdata: y\n\ndata: z\n\n") == [(None, b"z")]


def test_event_without_trailing_blank_line_is_not_dispatched() -> None:
    assert decode(b"data: 1\n\ndata: 2\n") == [(None, b"1")]
    assert decode(b"data: 1\n\ndata: 2") == [(None, b"1")]


def test_empty_event_field_is_none() -> None:
    assert decode(b"event:\ndata: x\n\n") == [(None, b"x")]
    assert decode(b"event: \ndata: x\n\n") == [(None, b"x")]
    assert decode(b"event: a\nevent:\ndata: x\n\n") == [(None, b"x")]


def test_event_name_is_decoded_as_utf8() -> None:
    name = "r\u00e9ponse.\u2603"
    body = b"event: " + name.encode() + b"\ndata: x\n\n"
    assert bytewise(body) == [(name, b"x")]


def test_empty_chunks_change_nothing() -> None:
    assert decode(b"", b"data: a\r", b"", b"\n", b"", b"\r\n", b"") == [(None, b"a")]


def test_cr_split_from_lf_counts_once() -> None:
    # `\r` then `\n` in the next chunk is one line end, not a line end and a blank line.
    assert decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [(None, b"a\nb")]
    # `\r` then `\r`: two line ends, so a blank line.
    assert decode(b"data: a\r", b"\rdata: b\r\r") == [(None, b"a"), (None, b"b")]


def test_events_come_out_as_soon_as_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: a\ndata: 1\n\nevent: b\nda") == [("a", b"1")]
    assert decoder.feed(b"ta: 2") == []
    assert decoder.feed(b"\n\n") == [("b", b"2")]


# --- generated streams ----------------------------------------------------------------------

LINE_ENDS = (b"\n", b"\r\n", b"\r")
# Field values: any text without line breaks (a value cannot hold CR or LF).
values = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)


@dataclass(frozen=True)
class Generated:
    event: str | None
    data: list[str]
    comments: list[tuple[int, str]]


@st.composite
def generated_events(draw: st.DrawFn) -> Generated:
    event = draw(st.none() | values)
    data = draw(st.lists(values, min_size=1, max_size=4))
    comment_count = len(data) + (2 if event is not None else 1)
    comments = draw(st.lists(st.tuples(st.integers(0, comment_count), values), max_size=3))
    return Generated(event, data, comments)


def serialize(events: list[Generated], line_ends: st.DataObject, *, lf_only: bool = False) -> bytes:
    """An SSE body for `events`, each line ending as `line_ends` draws (LF with `lf_only`)."""
    out: list[bytes] = []

    def line(text: str) -> None:
        ends: tuple[bytes, ...] = (b"\n",) if lf_only else LINE_ENDS
        if not text and out and out[-1].endswith(b"\r"):
            # A CR then an empty line ended by LF would read as one CRLF.
            ends = (b"\r\n", b"\r")
        out.append(text.encode() + line_ends.draw(st.sampled_from(ends)))

    for generated in events:
        lines: list[str] = []
        if generated.event is not None:
            lines.append("event: " + generated.event)
        lines.extend("data: " + value for value in generated.data)
        for position, text in sorted(generated.comments, key=lambda pair: pair[0]):
            lines.insert(min(position, len(lines)), ":" + text)
        for text in lines:
            line(text)
        line("")
    return b"".join(out)


def expected_events(events: list[Generated]) -> list[SSEEvent]:
    return [(generated.event or None, "\n".join(generated.data).encode()) for generated in events]


@st.composite
def cuts(draw: st.DrawFn, body: bytes) -> list[bytes]:
    """`body` cut into chunks, including 1-byte chunks, cuts between CR and LF, and cuts after
    each blank line (chunks of whole events, the decoder's fast path)."""
    if not body:
        return []
    style = draw(st.sampled_from(["random", "bytes", "crlf", "events"]))
    if style == "bytes":
        return [body[index : index + 1] for index in range(len(body))]
    points = set(draw(st.lists(st.integers(1, len(body)), max_size=20)))
    if style == "crlf":
        points.update(index + 1 for index in range(len(body) - 1) if body[index] == 0x0D)
    if style == "events":
        points = {index + 2 for index in range(len(body) - 1) if body[index : index + 2] == b"\n\n"}
        points.add(draw(st.integers(1, len(body))))  # and one cut anywhere
    bounds = [0, *sorted(points), len(body)]
    return [body[start:end] for start, end in itertools.pairwise(bounds)]


@settings(max_examples=200)
@given(
    events=st.lists(generated_events(), max_size=6),
    bom=st.booleans(),
    data=st.data(),
)
def test_chunked_stream_decodes_like_the_whole_body(
    events: list[Generated], bom: bool, data: st.DataObject
) -> None:
    body = (b"\xef\xbb\xbf" if bom else b"") + serialize(events, data)
    chunks = data.draw(cuts(body))
    assert b"".join(chunks) == body
    whole = decode(body)
    assert whole == expected_events(events)
    assert decode(*chunks) == whole


# The fast path is also cut at blank lines by the chunked test above (its "events" style).
@settings(max_examples=100)
@given(events=st.lists(generated_events(), min_size=1, max_size=6), data=st.data())
def test_chunks_of_whole_events_decode_like_the_whole_body(
    events: list[Generated], data: st.DataObject
) -> None:
    # How servers flush: LF line ends, each chunk one or more whole events.
    body = serialize(events, data, lf_only=True)
    bounds = [index + 2 for index in range(len(body) - 1) if body[index : index + 2] == b"\n\n"]
    kept = sorted(set(data.draw(st.lists(st.sampled_from(bounds)))) | {len(body)})
    chunks = [body[start:end] for start, end in itertools.pairwise([0, *kept])]
    decoder = SSEDecoder()
    decoder.feed(b":\n\n")  # past the start, as in the middle of a stream
    assert [event for chunk in chunks for event in decoder.feed(chunk)] == expected_events(events)


@settings(max_examples=200)
@given(body=st.binary(max_size=60), data=st.data())
def test_arbitrary_bytes_decode_the_same_in_any_chunks(body: bytes, data: st.DataObject) -> None:
    chunks = data.draw(cuts(body))
    assert decode(*chunks) == decode(body)


@given(
    events=st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["response.created", "response.output_text.delta", "error"])},
            optional={"delta": st.text(), "sequence_number": st.integers(0, 10**6)},
        ),
        max_size=8,
    )
)
def test_encoded_events_decode_to_themselves(events: list[dict[str, object]]) -> None:
    decoder = SSEDecoder()
    decoded = decoder.feed(b"".join(encode_sse(event) for event in events))
    assert [(kind, orjson.loads(data)) for kind, data in decoded] == [
        (e["type"], e) for e in events
    ]


def blocks_of(*chunks: bytes) -> tuple[list[SSEBlock], bytes]:
    splitter = SSEBlocks()
    blocks = [block for chunk in chunks for block in splitter.feed(chunk)]
    return blocks, splitter.rest()


@settings(max_examples=100)
@given(
    events=st.lists(generated_events(), max_size=6),
    bom=st.booleans(),
    tail=st.binary(max_size=8),
    data=st.data(),
)
def test_blocks_keep_every_byte_and_dispatch_as_the_decoder(
    events: list[Generated], bom: bool, tail: bytes, data: st.DataObject
) -> None:
    """Cut anywhere, the blocks put back together are the body, and their events are the
    decoder's."""
    body = (b"\xef\xbb\xbf" if bom else b"") + serialize(events, data) + tail
    blocks, rest = blocks_of(*data.draw(cuts(body)))
    assert b"".join(block.raw for block in blocks) + rest == body
    assert [block.event for block in blocks if block.event is not None] == decode(body)


@settings(max_examples=200)
@given(body=st.binary(max_size=60), data=st.data())
def test_blocks_of_arbitrary_bytes_keep_every_byte(body: bytes, data: st.DataObject) -> None:
    blocks, rest = blocks_of(*data.draw(cuts(body)))
    assert b"".join(block.raw for block in blocks) + rest == body
    assert [block.event for block in blocks if block.event is not None] == decode(body)


def test_comments_pass_at_once_and_events_wait_for_their_blank_line() -> None:
    splitter = SSEBlocks()
    assert [block.raw for block in splitter.feed(b": ping\r\n")] == [b": ping\r\n"]
    assert splitter.feed(b"id: 7\r\ndata: {}\r\n") == []
    (block,) = splitter.feed(b"\r\n")
    assert block.raw == b"id: 7\r\ndata: {}\r\n\r\n"
    assert block.event == (None, b"{}")


def test_with_data_replaces_only_the_data_lines() -> None:
    (block,) = SSEBlocks().feed(b'id: 1\r\nevent: e\r\ndata: {"a":\r\n: c\r\ndata:1}\r\n\r\n')
    assert block.with_data(b'{"a":2}') == b'id: 1\r\nevent: e\r\ndata: {"a":2}\r\n: c\r\n\r\n'
    assert block.with_data(b"x\ny") == b"id: 1\r\nevent: e\r\ndata: x\r\ndata: y\r\n: c\r\n\r\n"


def test_one_event_stream_check_for_every_path() -> None:
    # The handler call, stateful HTTP and the proxy all decide "is this an event stream" here.
    from ws_mode._sse import content_type, is_event_stream

    headers = [(b"X-A", b"1"), (b"Content-Type", b"Text/Event-Stream; charset=utf-8")]
    assert content_type(headers) == b"text/event-stream; charset=utf-8"
    assert is_event_stream(content_type(headers))
    assert not is_event_stream(content_type([(b"content-type", b"application/json")]))
    assert content_type([]) == b""
    assert not is_event_stream(b"")


def test_an_event_from_a_whole_chunk_gets_its_data_replaced_too() -> None:
    # A chunk of whole LF-framed events is cut at its blank lines (one piece per event, not
    # per line): replacing the data must still find the data line inside the piece. Stateful
    # HTTP's echo of previous_response_id was lost on every event after such a chunk.
    blocks = SSEBlocks()
    blocks.feed(b"data: {}\n\n")  # the stream has started: the next whole chunk is cut fast
    (comment, event) = blocks.feed(b': ping\n\n:\nid: 1\nevent: e\ndata: {"a":1}\n\n')
    assert event.event is not None
    assert event.with_data(b'{"a":2}') == b':\nid: 1\nevent: e\ndata: {"a":2}\n\n'
    assert comment.event is None


def test_pending_counts_what_an_unfinished_event_holds_and_drops_at_its_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: x\ndata: " + b"a" * 100) == []
    for _ in range(9):  # one data line in many chunks
        assert decoder.feed(b"a" * 100) == []
    assert decoder.pending >= 1000
    assert decoder.feed(b"\ndata: b\n") == []  # a second data line, the event still open
    assert decoder.pending >= 1000
    assert decoder.feed(b"\n") == [("x", b"a" * 1000 + b"\nb")]
    assert decoder.pending == 0
