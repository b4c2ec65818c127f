"""`PageList`: the pages of one request, in logical order, shared by every layer.

Logical token `t` of the request lives in page `page_ids[t // page_size]` at offset
`t % page_size`, i.e. in slot `page_ids[t // page_size] * page_size + t % page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagepool._validate import as_int
from pagepool.errors import InvalidArgument, PageListReleased
from pagepool.pool import PageCopy, PagePool

__all__ = ["AppendResult", "PageList"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResult:
    """Where the appended tokens go, and the copies storage must make first.

    Attributes:
        slots: One slot (`page_id * page_size + offset`) per new token, in order.
        copies: Copy-on-write copies to perform (`KVStorage.copy_pages`) before writing.
    """

    slots: tuple[int, ...]
    copies: tuple[PageCopy, ...]


class PageList:
    """The page ids of one request and its number of tokens.

    The list holds one reference to each of its pages. `append` allocates a page only when
    the tail page is full, and copies a shared tail page before writing into it.

    Args:
        pool: The pool every page comes from.

    Example:
        >>> pages = PageList(PagePool(page_size=4, num_pages=8))
        >>> pages.append(5).slots
        (0, 1, 2, 3, 4)
        >>> pages.page_ids
        (0, 1)
    """

    def __init__(self, pool: PagePool) -> None:
        if not isinstance(pool, PagePool):
            raise InvalidArgument(f"pool must be a PagePool, got {type(pool).__name__}")
        self._pool = pool
        self._page_ids: list[int] = []
        self._context_len = 0
        self._released = False

    @property
    def pool(self) -> PagePool:
        """The pool the pages come from."""
        return self._pool

    @property
    def released(self) -> bool:
        """Whether `release()` has returned the pages."""
        return self._released

    @property
    def context_len(self) -> int:
        """Tokens appended so far."""
        self._check_live("context_len")
        return self._context_len

    @property
    def page_ids(self) -> tuple[int, ...]:
        """Page ids in logical order; exactly `ceil(context_len / page_size)` of them."""
        self._check_live("page_ids")
        return tuple(self._page_ids)

    def can_append(self, num_tokens: int) -> bool:
        """Whether `append(num_tokens)` would find the pages it needs."""
        self._check_live("can_append")
        num_tokens = as_int(num_tokens, "num_tokens")
        return self._pool.can_allocate(self._pages_needed(num_tokens))

    def append(self, num_tokens: int) -> AppendResult:
        """Reserve slots for `num_tokens` new tokens at the end of the request.

        On failure the list and the pool are exactly as before.

        Returns:
            The slot of every new token and the copy-on-write copies to perform first.

        Raises:
            InvalidArgument: `num_tokens` is not an int >= 0.
            PoolExhausted: A fixed pool has too few free pages.
            PageListReleased: The list was released.
        """
        self._check_live("append")
        num_tokens = as_int(num_tokens, "num_tokens")
        if num_tokens == 0:
            return AppendResult(slots=(), copies=())
        # All pages (copy-on-write included) are made available first, so nothing below fails.
        self._pool._make_room(self._pages_needed(num_tokens), f"append({num_tokens})")
        copies: tuple[PageCopy, ...] = ()
        if self._tail_has_room():
            copy = self._pool.ensure_writable(self._page_ids[-1])
            if copy is not None:
                self._page_ids[-1] = copy.dst
                copies = (copy,)
        start = self._context_len
        self._page_ids.extend(self._pool.allocate(self._num_new_pages(num_tokens)))
        self._context_len += num_tokens
        page_size = self._pool.page_size
        first_page, last_page = start // page_size, (self._context_len - 1) // page_size
        for index in range(first_page, last_page + 1):
            filled = min(page_size, self._context_len - index * page_size)
            self._pool._record_fill(self._page_ids[index], filled)
        return AppendResult(slots=self.slots(start, self._context_len), copies=copies)

    def slots(self, start: int, stop: int) -> tuple[int, ...]:
        """Slots of logical tokens `start .. stop - 1` (0 <= start <= stop <= context_len)."""
        self._check_live("slots")
        start = as_int(start, "start")
        stop = as_int(stop, "stop", minimum=start)
        if stop > self._context_len:
            raise InvalidArgument(
                f"slots({start}, {stop}): stop must be <= context_len={self._context_len}"
            )
        page_size = self._pool.page_size
        page_ids = self._page_ids
        return tuple(
            page_ids[t // page_size] * page_size + t % page_size for t in range(start, stop)
        )

    def fork(self) -> PageList:
        """A new list sharing every page of this one (each page gains one holder).

        Writes by either list afterwards go through copy-on-write, so neither sees the other's
        new tokens.
        """
        self._check_live("fork")
        self._pool.share(self._page_ids)
        child = PageList(self._pool)
        child._page_ids = list(self._page_ids)
        child._context_len = self._context_len
        return child

    def release(self) -> None:
        """Return every page to the pool exactly once; calling it again does nothing."""
        if self._released:
            return
        self._pool.free(self._page_ids)
        self._page_ids = []
        self._context_len = 0
        self._released = True

    # -- private ---------------------------------------------------------------------------

    def _tail_has_room(self) -> bool:
        return self._context_len % self._pool.page_size != 0

    def _num_new_pages(self, num_tokens: int) -> int:
        room = len(self._page_ids) * self._pool.page_size - self._context_len
        return self._pool.pages_for(max(0, num_tokens - room))

    def _pages_needed(self, num_tokens: int) -> int:
        if num_tokens == 0:
            return 0
        tail_shared = self._tail_has_room() and self._pool.refcount(self._page_ids[-1]) > 1
        return self._num_new_pages(num_tokens) + tail_shared

    def _check_live(self, operation: str) -> None:
        if self._released:
            raise PageListReleased(
                f"PageList.{operation}: the list was released; its pages are back in the pool"
            )

    def __repr__(self) -> str:
        if self._released:
            return "PageList(released)"
        return f"PageList(context_len={self._context_len}, page_ids={self._page_ids})"
