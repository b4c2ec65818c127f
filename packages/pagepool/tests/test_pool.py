"""PagePool: allocation, capacity modes, reference counts, copy-on-write, failure atomicity."""

from __future__ import annotations

import pytest
from pagepool_test_helpers import snapshot

from pagepool import (
    InvalidArgument,
    InvalidPageId,
    PageAlreadyFree,
    PageCopy,
    PagePool,
    PagePoolError,
    PoolExhausted,
    pages_for,
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"page_size": 0, "num_pages": 4}, "page_size must be an int >= 1, got 0"),
        ({"page_size": -3, "num_pages": 4}, "page_size must be an int >= 1, got -3"),
        ({"page_size": 2.0, "num_pages": 4}, "page_size must be an int >= 1, got 2.0"),
        ({"page_size": True, "num_pages": 4}, "page_size must be an int >= 1, got True"),
        ({"page_size": 4, "num_pages": 0}, "num_pages must be an int >= 1, got 0"),
        ({"page_size": 4, "num_pages": "8"}, "num_pages must be an int >= 1, got '8'"),
        ({"page_size": 4, "num_pages": 8, "growable": 1}, "growable must be a bool"),
    ],
    ids=["zero-page-size", "negative-page-size", "float-page-size", "bool-page-size",
         "zero-pages", "str-pages", "int-growable"],
)  # fmt: skip
def test_constructor_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        PagePool(**kwargs)


def test_allocate_hands_out_distinct_live_pages(pool: PagePool) -> None:
    first = pool.allocate(3)
    second = pool.allocate(2)
    assert len(set(first + second)) == 5
    assert all(pool.refcount(page_id) == 1 for page_id in first + second)
    assert (pool.num_live, pool.num_free, pool.capacity) == (5, 3, 8)
    assert pool.allocate(0) == []


@pytest.mark.parametrize("bad", [-1, 1.5, True, None, "2"], ids=repr)
def test_allocate_rejects_bad_counts_and_changes_nothing(pool: PagePool, bad: object) -> None:
    pool.allocate(2)
    before = snapshot(pool)
    with pytest.raises(InvalidArgument, match="num_pages must be an int >= 0"):
        pool.allocate(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        pool.can_allocate(bad)  # type: ignore[arg-type]
    assert snapshot(pool) == before


def test_fixed_pool_raises_typed_exhaustion_and_changes_nothing(pool: PagePool) -> None:
    pool.allocate(6)
    before = snapshot(pool)
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    with pytest.raises(PoolExhausted, match="needs 3 page.* only 2 are free") as error:
        pool.allocate(3)
    assert (error.value.requested, error.value.free) == (3, 2)
    assert isinstance(error.value, RuntimeError) and isinstance(error.value, PagePoolError)
    assert snapshot(pool) == before


def test_growable_pool_doubles_and_counts_growth_bytes(growable_pool: PagePool) -> None:
    calls: list[tuple[int, int]] = []

    def listener(old: int, new: int) -> int:
        calls.append((old, new))
        return 10 * old

    growable_pool.add_growth_listener(listener)
    assert growable_pool.can_allocate(1000)
    growable_pool.allocate(3)  # 2 -> 4
    growable_pool.allocate(10)  # 13 live: 4 -> 8 -> 16 in one growth
    metrics = growable_pool.metrics()
    assert calls == [(2, 4), (4, 16)]
    assert (metrics.capacity, metrics.num_growths, metrics.growth_copied_bytes) == (16, 2, 60)
    assert (metrics.num_live_pages, metrics.num_free_pages) == (13, 3)
    growable_pool.remove_growth_listener(listener)
    growable_pool.allocate(4)
    assert len(calls) == 2 and growable_pool.capacity == 32


def test_failing_growth_listener_leaves_the_pool_unchanged(growable_pool: PagePool) -> None:
    def out_of_memory(old: int, new: int) -> int:
        raise MemoryError(f"cannot grow {old} -> {new}")

    growable_pool.allocate(2)
    growable_pool.add_growth_listener(out_of_memory)
    before = snapshot(growable_pool)
    with pytest.raises(MemoryError):
        growable_pool.allocate(1)
    assert snapshot(growable_pool) == before


def test_growth_listener_must_be_callable_and_known(pool: PagePool) -> None:
    with pytest.raises(InvalidArgument, match="must be callable"):
        pool.add_growth_listener(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="is not a growth listener"):
        pool.remove_growth_listener(print)  # type: ignore[arg-type]


def test_share_and_free_count_holders(pool: PagePool) -> None:
    a, b = pool.allocate(2)
    pool.share([a, a])
    assert pool.refcount(a) == 3 and pool.metrics().num_shared_pages == 1
    pool.free([a])
    pool.free([a, b])
    assert (pool.refcount(a), pool.refcount(b)) == (1, 0)
    assert pool.metrics().num_shared_pages == 0
    assert pool.num_live == 1


def test_free_of_a_free_page_raises_already_free_and_changes_nothing(pool: PagePool) -> None:
    a, b = pool.allocate(2)
    pool.free([b])
    before = snapshot(pool)
    with pytest.raises(PageAlreadyFree, match=f"free: page {b} is already free") as error:
        pool.free([a, b])
    assert error.value.page_id == b
    # Freeing one holder twice in one call is the same error, and also atomic.
    with pytest.raises(PageAlreadyFree, match=f"page {a}"):
        pool.free([a, a])
    assert snapshot(pool) == before


@pytest.mark.parametrize("bad", [-1, 8, 99, 2.0, True, "0"], ids=repr)
def test_unknown_page_ids_are_rejected_everywhere(pool: PagePool, bad: object) -> None:
    (page_id,) = pool.allocate(1)
    before = snapshot(pool)
    for operation in (pool.free, pool.share):
        with pytest.raises(InvalidPageId, match=r"is not an int in \[0, 8\)"):
            operation([page_id, bad])  # type: ignore[list-item]
    for query in (pool.refcount, pool.ensure_writable):
        with pytest.raises(InvalidPageId):
            query(bad)  # type: ignore[arg-type]
    assert snapshot(pool) == before


def test_page_id_collections_must_be_iterables(pool: PagePool) -> None:
    with pytest.raises(InvalidArgument, match="iterable of ints"):
        pool.free(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="iterable of ints"):
        pool.share("01")  # type: ignore[arg-type]


def test_sharing_a_free_page_is_refused(pool: PagePool) -> None:
    (a,) = pool.allocate(1)
    before = snapshot(pool)
    with pytest.raises(PageAlreadyFree, match="share: page 5"):
        pool.share([a, 5])
    assert snapshot(pool) == before


def test_ensure_writable_copies_only_shared_pages(pool: PagePool) -> None:
    (a,) = pool.allocate(1)
    assert pool.ensure_writable(a) is None
    pool.share([a])
    copy = pool.ensure_writable(a)
    assert isinstance(copy, PageCopy) and copy.src == a and copy.dst != a
    assert (pool.refcount(a), pool.refcount(copy.dst)) == (1, 1)
    metrics = pool.metrics()
    assert (metrics.num_cow_copies, metrics.num_shared_pages, metrics.num_live_pages) == (1, 0, 2)


def test_ensure_writable_failures_change_nothing(pool: PagePool) -> None:
    pages = pool.allocate(8)
    pool.share(pages[:1])
    before = snapshot(pool)
    with pytest.raises(PoolExhausted, match="copy-on-write needs 1 page"):
        pool.ensure_writable(pages[0])
    assert snapshot(pool) == before
    pool.free(pages[1:2])
    before = snapshot(pool)
    with pytest.raises(PageAlreadyFree, match=f"ensure_writable: page {pages[1]}"):
        pool.ensure_writable(pages[1])
    assert snapshot(pool) == before


def test_reused_allocations_and_peak_are_counted(pool: PagePool) -> None:
    pages = pool.allocate(8)
    pool.free(pages[3:5])
    assert sorted(pool.allocate(2)) == pages[3:5]
    pool.free(pages[:4])
    metrics = pool.metrics()
    assert metrics.num_reused_allocations == 2
    assert metrics.num_allocations == 10
    assert (metrics.peak_live_pages, metrics.num_live_pages) == (8, 4)


def test_tail_waste_counts_every_unused_slot_of_live_pages(pool: PagePool) -> None:
    pool.allocate(3)
    assert pool.metrics().tail_waste_slots == 12
    assert pool.metrics().used_slots == 0


def test_pool_operations_scale_with_pages_touched() -> None:
    big = PagePool(page_size=16, num_pages=200_000)
    pages = big.allocate(200_000)
    # Freeing and reallocating one page at a time must not scan the pool: with O(n) removal
    # this loop would take minutes; with a deque it takes milliseconds.
    for page_id in pages[:20_000]:
        big.free([page_id])
        assert big.allocate(1) == [page_id]
    assert big.num_free == 0 and big.metrics().num_reused_allocations == 20_000


@pytest.mark.parametrize(
    ("num_tokens", "page_size", "expected"),
    [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (10, 4, 3), (17, 1, 17), (15, 16, 1)],
)
def test_pages_for_is_the_ceiling_of_tokens_over_page_size(
    num_tokens: int, page_size: int, expected: int
) -> None:
    assert pages_for(num_tokens, page_size) == expected
    assert PagePool(page_size, 1).pages_for(num_tokens) == expected


@pytest.mark.parametrize(
    ("num_tokens", "page_size", "match"),
    [
        (-1, 4, "num_tokens must be an int >= 0, got -1"),
        (2.5, 4, "num_tokens must be an int >= 0, got 2.5"),
        (3, 0, "page_size must be an int >= 1, got 0"),
        (3, True, "page_size must be an int >= 1, got True"),
    ],
    ids=["negative-tokens", "float-tokens", "zero-page-size", "bool-page-size"],
)
def test_pages_for_rejects_bad_arguments(num_tokens: object, page_size: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        pages_for(num_tokens, page_size)  # type: ignore[arg-type]


def test_repr_names_the_mode(pool: PagePool, growable_pool: PagePool) -> None:
    assert "fixed" in repr(pool) and "growable" in repr(growable_pool)
