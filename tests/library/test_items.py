"""Items held decoded, encoded or both (`ws_mode._items`): each form is made from the other on
first use and then kept; an encoding is exactly as large as it counts; a request body is one
join of encoded fragments with `input` last."""

from __future__ import annotations

import sys
from typing import Any

import orjson

from ws_mode._items import Items, encode_items, with_input

MESSAGE: dict[str, Any] = {"role": "user", "content": "Hello"}
CALL: dict[str, Any] = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def test_encode_items_gives_an_arrays_contents_without_brackets() -> None:
    fragment = encode_items([MESSAGE, CALL])
    assert fragment == orjson.dumps(MESSAGE) + b"," + orjson.dumps(CALL)
    assert orjson.loads(b"[" + fragment + b"]") == [MESSAGE, CALL]
    assert encode_items([]) == b""


def test_an_encoding_holds_no_more_memory_than_its_length() -> None:
    # Item by item, each encoding left a buffer of about 4 KiB behind: a million tiny items
    # cost gigabytes. The fragment is one exact-size bytes object.
    fragment = encode_items([{"n": number} for number in range(10_000)])
    assert sys.getsizeof(fragment) == sys.getsizeof(b"") + len(fragment)


def test_items_given_decoded_are_encoded_on_first_use_and_kept() -> None:
    given = [MESSAGE, CALL]
    items = Items(given)
    assert items.decoded
    assert items.list is given  # not copied
    fragment = items.fragment
    assert fragment == encode_items(given)
    assert items.fragment is fragment  # encoded once


def test_items_given_encoded_stay_encoded_until_asked_for_as_objects() -> None:
    fragment = encode_items([MESSAGE, CALL])
    items = Items(fragment=fragment)
    assert not items.decoded
    assert repr(items) == "<Items encoded>"
    assert items.fragment is fragment  # reading the encoding decodes nothing
    assert not items.decoded
    decoded = items.list
    assert decoded == [MESSAGE, CALL]
    assert items.decoded
    assert repr(items) == "<Items decoded>"
    assert items.list is decoded  # decoded once
    assert items.fragment is fragment  # and the encoding is not made again


def test_no_items_are_an_empty_list_and_an_empty_encoding() -> None:
    for items in (Items(), Items([]), Items(fragment=b"")):
        assert items.list == []
        assert items.fragment == b""


def test_encoded_only_holds_the_same_items_without_their_objects() -> None:
    items = Items([MESSAGE])
    shipped = items.encoded_only()
    assert not shipped.decoded
    assert shipped.fragment == items.fragment
    assert shipped.list == [MESSAGE]
    assert items.decoded  # the original keeps its objects


def test_with_input_adds_the_fragments_as_input_last() -> None:
    head = orjson.dumps({"model": "m", "stream": True})
    body = with_input(head, [encode_items([MESSAGE]), encode_items([CALL, MESSAGE])])
    parsed = orjson.loads(body)
    assert parsed == {"model": "m", "stream": True, "input": [MESSAGE, CALL, MESSAGE]}
    assert list(parsed)[-1] == "input"


def test_with_input_on_an_empty_head_or_no_fragments() -> None:
    assert orjson.loads(with_input(b"{}", [encode_items([MESSAGE])])) == {"input": [MESSAGE]}
    assert orjson.loads(with_input(b"{}", [])) == {"input": []}
    assert orjson.loads(with_input(b'{"model":"m"}', [])) == {"model": "m", "input": []}
