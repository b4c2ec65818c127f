"""PoolMetrics: a validated, frozen snapshot."""

from __future__ import annotations

import dataclasses

import pytest

from pagepool import PageList, PagePool, PoolMetrics

VALID = {
    "page_size": 4,
    "capacity": 8,
    "num_live_pages": 3,
    "num_free_pages": 5,
    "peak_live_pages": 4,
    "tail_waste_slots": 2,
    "num_allocations": 6,
    "num_reused_allocations": 1,
    "num_shared_pages": 1,
    "num_cow_copies": 1,
    "num_growths": 0,
    "growth_copied_bytes": 0,
}


def test_metrics_are_frozen_and_derive_used_slots() -> None:
    metrics = PoolMetrics(**VALID)
    assert metrics.used_slots == 3 * 4 - 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.capacity = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_live_pages": -1}, "num_live_pages must be an int >= 0, got -1"),
        ({"tail_waste_slots": 1.5}, "tail_waste_slots must be an int >= 0"),
        ({"page_size": 0}, "page_size must be >= 1"),
        ({"num_free_pages": 4}, r"live \(3\) \+ free \(4\) must equal capacity \(8\)"),
    ],
    ids=["negative", "float", "page-size", "unbalanced"],
)
def test_metrics_reject_inconsistent_values(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PoolMetrics(**{**VALID, **change})


def test_pool_metrics_track_a_request_lifecycle() -> None:
    pool = PagePool(page_size=4, num_pages=6)
    first = PageList(pool)
    first.append(6)
    fork = first.fork()
    fork.append(1)  # copy-on-write of the half-full tail
    first.release()
    second = PageList(pool)
    second.append(13)  # 4 pages: the 3 never used, then the freed page of `first`
    metrics = pool.metrics()
    assert metrics == PoolMetrics(
        page_size=4,
        capacity=6,
        num_live_pages=6,
        num_free_pages=0,
        peak_live_pages=6,
        tail_waste_slots=(8 - 7) + (16 - 13),
        num_allocations=7,
        num_reused_allocations=1,
        num_shared_pages=0,
        num_cow_copies=1,
        num_growths=0,
        growth_copied_bytes=0,
    )
