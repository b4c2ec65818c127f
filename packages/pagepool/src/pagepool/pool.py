"""`PagePool`: hands out page ids, counts references, and plans copy-on-write copies.

The pool owns ids and counts only; the K/V arrays live in `KVStorage`, which follows the pool's
growth through a listener. Every pool operation is O(pages touched) host bookkeeping; moving
the K/V data of a copy-on-write copy is `KVStorage.copy_pages`'s work, with its own cost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pagepool._validate import as_int
from pagepool.errors import InvalidArgument, InvalidPageId, PageAlreadyFree, PoolExhausted
from pagepool.metrics import PoolMetrics

__all__ = ["GrowthListener", "PageCopy", "PagePool", "pages_for"]

GrowthListener = Callable[[int, int], int]
"""Called as `listener(old_capacity, new_capacity)` before a growth takes effect; it enlarges
its storage and returns the number of bytes it copied."""

_GROWTH_FACTOR = 2


def pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold `num_tokens` tokens, `ceil(num_tokens / page_size)`.

    Args:
        num_tokens: Tokens, an int >= 0 (numpy integers too).
        page_size: Tokens per page, an int >= 1.

    Raises:
        InvalidArgument: Either argument is not an int in its range.

    Example:
        >>> pages_for(10, 4)
        3
    """
    num_tokens = as_int(num_tokens, "num_tokens")
    page_size = as_int(page_size, "page_size", minimum=1)
    return -(-num_tokens // page_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class PageCopy:
    """A copy-on-write copy that storage must perform before the writer writes.

    Attributes:
        src: Page id to copy from (still live, now with one holder fewer).
        dst: Fresh page id, owned by the writer, to copy into.

    Both ids accept any integer (numpy integers too) and are stored as `int`.
    """

    src: int
    dst: int

    def __post_init__(self) -> None:
        for name in ("src", "dst"):
            object.__setattr__(self, name, as_int(getattr(self, name), f"PageCopy.{name}"))
        if self.src == self.dst:
            raise InvalidArgument(f"PageCopy.src and dst must differ, got {self.src} twice")


class PagePool:
    """Page ids of `page_size` tokens each, with reference counts and copy-on-write.

    A page is free (reference count 0) or live (count >= 1, one per holder). A fixed pool
    raises `PoolExhausted` when an allocation does not fit; a growable pool doubles its
    capacity until it fits, after every growth listener has enlarged its storage.

    Args:
        page_size: Tokens per page, >= 1.
        num_pages: Initial capacity in pages, >= 1.
        growable: Grow instead of raising `PoolExhausted`.

    Example:
        >>> pool = PagePool(page_size=4, num_pages=8)
        >>> pool.allocate(2)
        [0, 1]
    """

    def __init__(self, page_size: int, num_pages: int, *, growable: bool = False) -> None:
        self._page_size = as_int(page_size, "page_size", minimum=1)
        num_pages = as_int(num_pages, "num_pages", minimum=1)
        if not isinstance(growable, bool):
            raise InvalidArgument(f"growable must be a bool, got {growable!r}")
        self._growable = growable
        self._free_ids: deque[int] = deque(range(num_pages))
        self._refcounts = [0] * num_pages
        # Filled token slots per page (shared pages hold one prefix, so one count per page).
        self._fills = [0] * num_pages
        self._was_freed = [False] * num_pages
        self._listeners: list[GrowthListener] = []
        self._num_used_slots = 0
        self._num_shared = 0
        self._peak_live = 0
        self._num_allocations = 0
        self._num_reused = 0
        self._num_cow_copies = 0
        self._num_growths = 0
        self._growth_copied_bytes = 0

    # -- queries ---------------------------------------------------------------------------

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self._page_size

    @property
    def growable(self) -> bool:
        """Whether the pool grows instead of raising `PoolExhausted`."""
        return self._growable

    @property
    def capacity(self) -> int:
        """Pages the pool holds now (live + free)."""
        return len(self._refcounts)

    @property
    def num_free(self) -> int:
        """Pages with a reference count of 0."""
        return len(self._free_ids)

    @property
    def num_live(self) -> int:
        """Pages with a reference count >= 1."""
        return self.capacity - self.num_free

    def can_allocate(self, num_pages: int) -> bool:
        """Whether `allocate(num_pages)` would succeed (always true for a growable pool)."""
        num_pages = as_int(num_pages, "num_pages")
        return self._growable or num_pages <= self.num_free

    def pages_for(self, num_tokens: int) -> int:
        """Pages of this pool needed to hold `num_tokens` tokens (`pages_for(n, page_size)`)."""
        return pages_for(num_tokens, self._page_size)

    def refcount(self, page_id: int) -> int:
        """Reference count of `page_id` (0 when free)."""
        return self._refcounts[self._check_id(page_id)]

    def metrics(self) -> PoolMetrics:
        """A snapshot of occupancy and history counters."""
        return PoolMetrics(
            page_size=self._page_size,
            capacity=self.capacity,
            num_live_pages=self.num_live,
            num_free_pages=self.num_free,
            peak_live_pages=self._peak_live,
            tail_waste_slots=self.num_live * self._page_size - self._num_used_slots,
            num_allocations=self._num_allocations,
            num_reused_allocations=self._num_reused,
            num_shared_pages=self._num_shared,
            num_cow_copies=self._num_cow_copies,
            num_growths=self._num_growths,
            growth_copied_bytes=self._growth_copied_bytes,
        )

    # -- mutations -------------------------------------------------------------------------

    def add_growth_listener(self, listener: GrowthListener) -> None:
        """Call `listener(old_capacity, new_capacity) -> bytes_copied` on every growth."""
        if not callable(listener):
            raise InvalidArgument(f"growth listener must be callable, got {listener!r}")
        self._listeners.append(listener)

    def remove_growth_listener(self, listener: GrowthListener) -> None:
        """Stop calling a listener added by `add_growth_listener`."""
        if listener not in self._listeners:
            raise InvalidArgument(f"{listener!r} is not a growth listener of this pool")
        self._listeners.remove(listener)

    def allocate(self, num_pages: int) -> list[int]:
        """Hand out `num_pages` free pages, each with reference count 1 and no tokens.

        Raises:
            InvalidArgument: `num_pages` is not an int >= 0.
            PoolExhausted: A fixed pool has fewer than `num_pages` free pages.
        """
        num_pages = as_int(num_pages, "num_pages")
        self._make_room(num_pages, "allocate")
        return [self._pop_free() for _ in range(num_pages)]

    def share(self, page_ids: Iterable[int]) -> None:
        """Add one holder to each listed live page (a page listed twice gets two).

        Raises:
            InvalidPageId: An id is outside `[0, capacity)`.
            PageAlreadyFree: A page is free; free pages cannot be shared.
        """
        page_ids = self._check_ids(page_ids)
        for page_id in page_ids:
            if self._refcounts[page_id] == 0:
                raise PageAlreadyFree(page_id, "share")
        for page_id in page_ids:
            self._refcounts[page_id] += 1
            if self._refcounts[page_id] == 2:
                self._num_shared += 1

    def free(self, page_ids: Iterable[int]) -> None:
        """Remove one holder from each listed page; a page with no holder left becomes free.

        Raises:
            InvalidPageId: An id is outside `[0, capacity)`.
            PageAlreadyFree: A page would be freed more times than it has holders.
        """
        page_ids = self._check_ids(page_ids)
        remaining: dict[int, int] = {}
        for page_id in page_ids:
            left = remaining.get(page_id, self._refcounts[page_id])
            if left == 0:
                raise PageAlreadyFree(page_id, "free")
            remaining[page_id] = left - 1
        for page_id in page_ids:
            self._drop_holder(page_id)

    def ensure_writable(self, page_id: int) -> PageCopy | None:
        """Make `page_id` safe for its caller to write: copy-on-write if it is shared.

        A page with one holder is returned as is (None). A shared page loses the caller as a
        holder, and the caller receives a fresh page holding the same tokens; storage must
        perform the returned copy before writing.

        Returns:
            The copy to perform, or None when the page was not shared.

        Raises:
            InvalidPageId: The id is outside `[0, capacity)`.
            PageAlreadyFree: The page is free.
            PoolExhausted: The page is shared and a fixed pool has no free page.
        """
        page_id = self._check_id(page_id)
        if self._refcounts[page_id] == 0:
            raise PageAlreadyFree(page_id, "ensure_writable")
        if self._refcounts[page_id] == 1:
            return None
        self._make_room(1, "copy-on-write")
        copy = PageCopy(src=page_id, dst=self._pop_free())
        self._drop_holder(page_id)
        self._record_fill(copy.dst, self._fills[page_id])
        self._num_cow_copies += 1
        return copy

    # -- package-internal (used by PageList) -----------------------------------------------

    def _make_room(self, num_pages: int, what: str) -> None:
        """Ensure `num_pages` free pages exist, growing if allowed; change nothing on failure."""
        if num_pages <= self.num_free:
            return
        if not self._growable:
            raise PoolExhausted(num_pages, self.num_free, what)
        old_capacity = self.capacity
        new_capacity = old_capacity
        while new_capacity - self.num_live < num_pages:
            new_capacity *= _GROWTH_FACTOR
        # Listeners run first: if one fails, the pool is unchanged (a storage that already grew
        # is only larger than needed, which is harmless).
        copied = 0
        for listener in self._listeners:
            copied += as_int(listener(old_capacity, new_capacity), "growth listener result")
        added = new_capacity - old_capacity
        self._free_ids.extend(range(old_capacity, new_capacity))
        self._refcounts.extend([0] * added)
        self._fills.extend([0] * added)
        self._was_freed.extend([False] * added)
        self._num_growths += 1
        self._growth_copied_bytes += copied

    def _record_fill(self, page_id: int, num_slots: int) -> None:
        """Set how many leading token slots of live page `page_id` hold tokens."""
        self._num_used_slots += num_slots - self._fills[page_id]
        self._fills[page_id] = num_slots

    # -- private ---------------------------------------------------------------------------

    def _pop_free(self) -> int:
        page_id = self._free_ids.popleft()
        self._refcounts[page_id] = 1
        self._num_allocations += 1
        self._num_reused += self._was_freed[page_id]
        self._peak_live = max(self._peak_live, self.num_live)
        return page_id

    def _drop_holder(self, page_id: int) -> None:
        self._refcounts[page_id] -= 1
        if self._refcounts[page_id] == 1:
            self._num_shared -= 1
        elif self._refcounts[page_id] == 0:
            self._record_fill(page_id, 0)
            self._was_freed[page_id] = True
            self._free_ids.append(page_id)

    def _check_id(self, page_id: object) -> int:
        if isinstance(page_id, bool) or not hasattr(page_id, "__index__"):
            raise InvalidPageId(page_id, self.capacity)
        index = page_id.__index__()
        if not 0 <= index < self.capacity:
            raise InvalidPageId(page_id, self.capacity)
        return index

    def _check_ids(self, page_ids: Iterable[int]) -> list[int]:
        if isinstance(page_ids, (str, bytes)) or not isinstance(page_ids, Iterable):
            raise InvalidArgument(f"page_ids must be an iterable of ints, got {page_ids!r}")
        return [self._check_id(page_id) for page_id in page_ids]

    def __repr__(self) -> str:
        kind = "growable" if self._growable else "fixed"
        return (
            f"PagePool(page_size={self._page_size}, capacity={self.capacity}, "
            f"live={self.num_live}, free={self.num_free}, {kind})"
        )
