"""Readable differences (`ws_mode.testing._diff`): the failure message names the one missing or
extra item, the first differing item, or the fields that differ."""

from __future__ import annotations

from ws_mode.testing._diff import diff_fields, diff_items, short

A, B, C = {"n": 1}, {"n": 2}, {"n": 3}


def test_diff_items_names_a_missing_or_extra_item() -> None:
    assert diff_items([A, B, C], [A, C]).splitlines() == [
        "expected 3 items, the handler received 2",
        'item 1 is missing: {"n":2}',
    ]
    assert diff_items([A], [A, B]).splitlines()[-1] == 'item 1 is extra: {"n":2}'


def test_diff_items_names_the_first_difference() -> None:
    assert diff_items([A, B], [A, C]).splitlines()[1:] == [
        "first difference at item 1:",
        '  expected: {"n":2}',
        '  received: {"n":3}',
    ]
    assert diff_items([A, B, C], [A]).splitlines()[-1] == 'item 1 is missing: {"n":2}'
    assert diff_items([A], "text") == "expected 1 items, received text"


def test_diff_fields_names_each_field() -> None:
    lines = diff_fields({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 4}).splitlines()
    assert lines == [
        "'b': expected 2, received 5",
        "'c' is missing (expected 3)",
        "'d' is unexpected: 4",
    ]


def test_short_cuts_long_values() -> None:
    assert short({"k": "v"}) == '{"k":"v"}'
    assert short("x" * 300, 10) == "xxxxxxxxxx… (290 more characters)"
