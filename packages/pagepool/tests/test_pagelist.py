"""PageList: slots, allocation on overflow only, fork + copy-on-write, release, atomicity."""

from __future__ import annotations

import pytest
from pagepool_test_helpers import snapshot

from pagepool import (
    AppendResult,
    InvalidArgument,
    PageAlreadyFree,
    PageCopy,
    PageList,
    PageListReleased,
    PagePool,
    PoolExhausted,
)


def test_append_returns_the_slot_of_every_new_token(pool: PagePool) -> None:
    pages = PageList(pool)
    first = pages.append(6)
    second = pages.append(3)
    ids = pages.page_ids
    expected = [ids[t // 4] * 4 + t % 4 for t in range(9)]
    assert first == AppendResult(slots=tuple(expected[:6]), copies=())
    assert second.slots == tuple(expected[6:]) and second.copies == ()
    assert pages.context_len == 9 and len(ids) == 3
    assert pages.slots(2, 7) == tuple(expected[2:7])


def test_append_zero_changes_nothing(pool: PagePool) -> None:
    pages = PageList(pool)
    before = snapshot(pool, pages)
    assert pages.append(0) == AppendResult(slots=(), copies=())
    assert snapshot(pool, pages) == before


def test_decode_allocates_a_page_only_when_the_tail_overflows() -> None:
    pool = PagePool(page_size=3, num_pages=16)
    pages = PageList(pool)
    pages.append(2)
    for _ in range(12):
        allocations_before = pool.metrics().num_allocations
        tail_full = pages.context_len % 3 == 0
        pages.append(1)
        assert pool.metrics().num_allocations - allocations_before == int(tail_full)
    assert len(pages.page_ids) == 5 and pool.metrics().tail_waste_slots == 1


@pytest.mark.parametrize("bad", [-1, 2.5, True, None], ids=repr)
def test_bad_token_counts_are_rejected_and_change_nothing(pool: PagePool, bad: object) -> None:
    pages = PageList(pool)
    pages.append(5)
    before = snapshot(pool, pages)
    with pytest.raises(InvalidArgument, match="num_tokens must be an int >= 0"):
        pages.append(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="num_tokens must be an int >= 0"):
        pages.can_append(bad)  # type: ignore[arg-type]
    assert snapshot(pool, pages) == before


def test_exhausted_append_leaves_list_and_pool_exactly_as_before(pool: PagePool) -> None:
    pages = PageList(pool)
    pages.append(21)  # 6 pages, 3 free slots in the tail
    other = PageList(pool)
    other.append(4)
    before = snapshot(pool, pages, other)
    assert pages.can_append(7) and not pages.can_append(8)
    with pytest.raises(PoolExhausted, match=r"append\(8\) needs 2 page.* only 1 are free") as error:
        pages.append(8)
    assert (error.value.requested, error.value.free) == (2, 1)
    assert snapshot(pool, pages, other) == before
    assert len(pages.append(7).slots) == 7  # the same list still works afterwards


def test_exhaustion_counts_the_copy_on_write_page(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(26)  # 7 pages, tail holds 2 of 4
    child = parent.fork()
    before = snapshot(pool, parent, child)
    assert parent.can_append(2)  # the copy of the shared tail takes the last free page...
    assert not parent.can_append(3)  # ...so a token past the copied tail cannot fit
    with pytest.raises(PoolExhausted, match="needs 2 page"):
        parent.append(3)
    assert snapshot(pool, parent, child) == before


def test_fork_shares_every_page_and_counts_holders(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(6)
    child = parent.fork()
    assert child.page_ids == parent.page_ids and child.context_len == 6
    assert all(pool.refcount(page_id) == 2 for page_id in parent.page_ids)
    assert pool.metrics().num_shared_pages == 2
    assert PageList(pool).fork().page_ids == ()


def test_write_into_shared_partial_tail_copies_first(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(6)  # pages [p0, p1], p1 holds 2 tokens
    child = parent.fork()
    shared_tail = parent.page_ids[1]
    result = child.append(3)  # tokens 6..8: fill the copied tail, then one new page
    (copy,) = result.copies
    assert copy == PageCopy(src=shared_tail, dst=child.page_ids[1])
    assert parent.page_ids[1] == shared_tail and pool.refcount(shared_tail) == 1
    assert result.slots[:2] == (copy.dst * 4 + 2, copy.dst * 4 + 3)
    assert pool.refcount(child.page_ids[0]) == 2
    # The parent is the only holder now: it writes in place.
    assert parent.append(1).copies == ()
    assert pool.metrics().num_cow_copies == 1


def test_shared_full_tail_needs_no_copy(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(8)
    child = parent.fork()
    result = child.append(1)
    assert result.copies == () and child.page_ids[:2] == parent.page_ids
    assert pool.metrics().num_cow_copies == 0


def test_release_returns_each_page_once_and_is_idempotent(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(9)
    child = parent.fork()
    child.append(2)  # copy of the shared tail
    parent.release()
    assert [pool.refcount(page_id) for page_id in child.page_ids] == [1, 1, 1]
    before = snapshot(pool, child)
    parent.release()
    assert snapshot(pool, child) == before
    child.release()
    assert pool.num_live == 0 and pool.metrics().tail_waste_slots == 0


@pytest.mark.parametrize(
    "use",
    [
        lambda pages: pages.append(1),
        lambda pages: pages.can_append(1),
        lambda pages: pages.fork(),
        lambda pages: pages.page_ids,
        lambda pages: pages.context_len,
        lambda pages: pages.slots(0, 0),
    ],
    ids=["append", "can_append", "fork", "page_ids", "context_len", "slots"],
)
def test_use_after_release_raises(pool: PagePool, use) -> None:
    pages = PageList(pool)
    pages.append(5)
    pages.release()
    before = snapshot(pool, pages)
    with pytest.raises(PageListReleased, match="the list was released"):
        use(pages)
    assert snapshot(pool, pages) == before and repr(pages) == "PageList(released)"


def test_slots_rejects_ranges_outside_the_context(pool: PagePool) -> None:
    pages = PageList(pool)
    pages.append(5)
    with pytest.raises(InvalidArgument, match="stop must be <= context_len=5"):
        pages.slots(0, 6)
    with pytest.raises(InvalidArgument, match="stop must be an int >= 3"):
        pages.slots(3, 2)


def test_page_list_needs_a_pool() -> None:
    with pytest.raises(InvalidArgument, match="pool must be a PagePool, got dict"):
        PageList({})  # type: ignore[arg-type]


def test_tail_waste_is_exact_with_shared_pages(pool: PagePool) -> None:
    parent = PageList(pool)
    parent.append(5)  # 2 pages, 3 empty slots
    child = parent.fork()  # shared pages count once
    assert pool.metrics().tail_waste_slots == 3
    child.append(1)  # copy of the tail (1 token) + 1 new token: 2 in the copy
    assert pool.metrics().tail_waste_slots == 3 + 2


def test_append_grows_a_growable_pool(growable_pool: PagePool) -> None:
    pages = PageList(growable_pool)
    result = pages.append(20)  # 7 pages of 3 from a pool of 2
    assert len(result.slots) == 20 and len(set(result.slots)) == 20
    assert growable_pool.capacity == 8 and growable_pool.metrics().num_growths == 1


def test_failed_growth_during_append_changes_nothing(growable_pool: PagePool) -> None:
    def refuse(old: int, new: int) -> int:
        raise MemoryError("no memory for the larger storage")

    pages = PageList(growable_pool)
    pages.append(4)
    child = pages.fork()
    growable_pool.add_growth_listener(refuse)
    before = snapshot(growable_pool, pages, child)
    with pytest.raises(MemoryError):
        pages.append(1)  # needs a copy-on-write page; the pool has none free
    assert snapshot(growable_pool, pages, child) == before


def test_release_that_finds_a_page_already_free_changes_nothing(pool: PagePool) -> None:
    pages = PageList(pool)
    pages.append(6)
    pool.free(pages.page_ids[1:])  # a bug elsewhere returned one of the list's pages
    before = snapshot(pool, pages)
    with pytest.raises(PageAlreadyFree, match=f"page {pages.page_ids[1]}"):
        pages.release()
    assert snapshot(pool, pages) == before and not pages.released
