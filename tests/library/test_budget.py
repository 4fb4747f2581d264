"""The memory budget's accounting: what each part reserves it gives back (on eviction, on
close, when a request ends), a reservation that does not fit is refused without touching what
is held, and new sockets wait until the refused work would fit again. (RSS:
tests/library/test_memory_budget.py.)"""

from __future__ import annotations

import pytest

from tests.library.test_cache import node
from tests.library.test_lanes import Recorder, create, settle
from ws_mode import Limits
from ws_mode._budget import CONNECTION_COST, Held, MemoryAccount, MemoryBudget
from ws_mode._cache import ResponseCache
from ws_mode._client_events import ProtocolError
from ws_mode._lanes import Lanes


def budget(limit: int = 1 << 30) -> MemoryBudget:
    return MemoryBudget(limit, MemoryAccount())


def test_a_cache_holds_in_the_budget_what_it_counts_and_gives_it_all_back() -> None:
    account = budget()
    cache = ResponseCache(max_entries=2, max_bytes=10**6, budget=account)
    root = node("root")
    child = node("child", root)
    cache.put(root)
    cache.put(child)
    assert account.held == cache.bytes == root.size + child.size
    cache.put(node("other"))
    cache.put(node("third"))  # by count: root and child evicted
    assert account.held == cache.bytes
    cache.evict("third")
    assert account.held == cache.bytes
    cache.clear()
    assert cache.bytes == 0
    assert account.held == 0
    assert account.used == 0


def test_a_response_the_budget_cannot_hold_is_not_cached_and_nothing_else_goes() -> None:
    first = node("first")
    account = budget(first.size + first.size // 2)
    cache = ResponseCache(max_entries=10, max_bytes=10**6, budget=account)
    assert cache.put(first)
    assert not cache.put(node("second"))
    assert "first" in cache
    assert "second" not in cache
    assert account.held == first.size
    assert account.refusals == 1
    why = cache.why_missing("second")
    assert why is not None
    assert "Limits.max_memory_bytes" in why


@pytest.mark.anyio
async def test_a_request_the_budget_cannot_hold_is_refused_and_the_rest_given_back() -> None:
    recorder = Recorder()
    account = budget(1000)
    lanes = Lanes(Limits(), run=recorder.run, refuse=recorder.refuse, budget=account)
    lanes.submit(create("a", "running"), 400)
    lanes.submit(create("a", "waiting"), 400)
    with pytest.raises(ProtocolError) as refused:
        lanes.submit(create("b", "too much"), 400)
    assert (refused.value.code, refused.value.status) == ("server_is_overloaded", 503)
    assert refused.value.type == "server_error"
    await settle()
    assert recorder.started == ["running"]
    assert account.held == 800
    recorder.gate("running").set()  # its turn ends: what it held is given back
    await settle()
    assert recorder.started == ["running", "waiting"]
    assert account.held == 400
    await lanes.stop()  # cancelled while running: given back too
    assert account.held == 0


def test_after_a_refusal_new_sockets_wait_until_the_refused_work_fits() -> None:
    account = budget(100 * CONNECTION_COST)
    assert account.reserve(90 * CONNECTION_COST)
    assert account.admits_connection()
    assert not account.reserve(20 * CONNECTION_COST)  # a frame: refused
    assert not account.admits_connection()  # room for a socket, not for that frame
    account.release(20 * CONNECTION_COST)
    assert account.admits_connection()


def test_every_middleware_of_a_process_counts_against_one_account() -> None:
    account = MemoryAccount()
    small, large = MemoryBudget(100, account), MemoryBudget(1000, account)
    assert large.reserve(90)
    assert not small.reserve(20)  # the process holds 90 already
    assert small.reserve(10)
    assert account.used == 100
    assert (small.held, large.held) == (10, 90)


def test_what_one_piece_of_work_holds_grows_and_is_let_go_in_part_or_whole() -> None:
    budget = MemoryBudget(100, MemoryAccount())
    held = Held(budget)
    assert held.add(60)
    assert not held.add(50)  # past the budget: refused, nothing more held
    assert (held.size, budget.used) == (60, 60)
    held.let_go(20)
    held.let_go(-5)  # nothing to let go
    assert (held.size, budget.used) == (40, 40)
    held.let_go()
    assert (held.size, budget.used) == (0, 0)
    free = Held(None)  # no budget: everything fits, nothing is counted
    assert free.add(10**12)
    free.let_go()
    assert free.size == 0
