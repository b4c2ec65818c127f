"""Typed errors of the pagepool package, all under `PagePoolError`.

Each error also inherits the builtin category it belongs to (`ValueError` for bad input,
`RuntimeError` for a state that cannot serve the request), so callers may catch either.
"""

from __future__ import annotations

__all__ = [
    "InvalidArgument",
    "InvalidMetadata",
    "InvalidPageId",
    "PageAlreadyFree",
    "PageListReleased",
    "PagePoolError",
    "PoolExhausted",
]


class PagePoolError(Exception):
    """Base class of every error raised by pagepool."""


class InvalidArgument(PagePoolError, ValueError):
    """An argument has the wrong type, sign, shape or dtype; nothing was changed."""


class PoolExhausted(PagePoolError, RuntimeError):
    """A fixed-capacity pool has too few free pages; nothing was changed.

    Attributes:
        requested: Pages the operation needed.
        free: Pages that were free.
    """

    def __init__(self, requested: int, free: int, what: str = "allocation") -> None:
        self.requested = requested
        self.free = free
        super().__init__(
            f"pool exhausted: {what} needs {requested} page(s) but only {free} are free "
            "(the pool has a fixed capacity)"
        )


class InvalidPageId(PagePoolError, ValueError):
    """A page id is not an integer in `[0, capacity)`.

    Attributes:
        page_id: The offending value.
        capacity: The pool's capacity at the time.
    """

    def __init__(self, page_id: object, capacity: int) -> None:
        self.page_id = page_id
        self.capacity = capacity
        super().__init__(f"page id {page_id!r} is not an int in [0, {capacity})")


class PageAlreadyFree(PagePoolError, ValueError):
    """An operation needed a live page (reference count >= 1) but the page is free.

    Attributes:
        page_id: The free page.
    """

    def __init__(self, page_id: int, operation: str) -> None:
        self.page_id = page_id
        super().__init__(f"{operation}: page {page_id} is already free (reference count 0)")


class PageListReleased(PagePoolError, RuntimeError):
    """A `PageList` was used after `release()` returned its pages to the pool."""


class InvalidMetadata(PagePoolError, ValueError):
    """Batch metadata breaks a rule (page range, aliasing, coverage, widths)."""
