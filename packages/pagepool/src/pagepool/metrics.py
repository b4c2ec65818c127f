"""`PoolMetrics`: a frozen snapshot of a page pool's occupancy and history counters."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["PoolMetrics"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolMetrics:
    """What a `PagePool` holds now and what it has done so far.

    Attributes:
        page_size: Tokens per page.
        capacity: Pages the pool can hand out now (live + free).
        num_live_pages: Pages with a reference count >= 1.
        num_free_pages: Pages with a reference count of 0.
        peak_live_pages: Largest `num_live_pages` ever reached.
        tail_waste_slots: Token slots in live pages that hold no token (exact; a shared page
            counts once).
        num_allocations: Pages handed out so far (including copy-on-write destinations).
        num_reused_allocations: Allocations of a page id that had been freed before.
        num_shared_pages: Live pages with a reference count > 1.
        num_cow_copies: Copy-on-write copies reported to storage.
        num_growths: Times a growable pool enlarged its capacity.
        growth_copied_bytes: Bytes that storage copied while growing (reported by the growth
            listeners).
    """

    page_size: int
    capacity: int
    num_live_pages: int
    num_free_pages: int
    peak_live_pages: int
    tail_waste_slots: int
    num_allocations: int
    num_reused_allocations: int
    num_shared_pages: int
    num_cow_copies: int
    num_growths: int
    growth_copied_bytes: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"PoolMetrics.{field.name} must be an int >= 0, got {value!r}")
        if self.page_size < 1:
            raise ValueError(f"PoolMetrics.page_size must be >= 1, got {self.page_size}")
        if self.num_live_pages + self.num_free_pages != self.capacity:
            raise ValueError(
                f"PoolMetrics: live ({self.num_live_pages}) + free ({self.num_free_pages}) "
                f"must equal capacity ({self.capacity})"
            )

    @property
    def used_slots(self) -> int:
        """Token slots in live pages that hold a token."""
        return self.num_live_pages * self.page_size - self.tail_waste_slots
