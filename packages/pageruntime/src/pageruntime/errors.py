"""Typed errors of the pageruntime package, all under `PageRuntimeError`.

Each error also inherits the builtin category it belongs to (`ValueError` for a request the
engine refuses, `RuntimeError` for a request that could not be served), so callers may catch
either.
"""

from __future__ import annotations

__all__ = ["KVCapacityExceeded", "PageRuntimeError", "RequestFailed", "RequestRejected"]


class PageRuntimeError(Exception):
    """Base class of every error raised by pageruntime."""


class RequestRejected(PageRuntimeError, ValueError):
    """`add_request` refused a request before anything was allocated; nothing changed."""


class KVCapacityExceeded(PageRuntimeError, RuntimeError):
    """A request's context outgrew the whole KV pool, even with every other request preempted.

    Attributes:
        request_id: The request that could not grow.
        num_pages_needed: Pages its context needs.
        capacity: Pages the pool holds.
    """

    def __init__(self, request_id: int, num_pages_needed: int, capacity: int) -> None:
        self.request_id = request_id
        self.num_pages_needed = num_pages_needed
        self.capacity = capacity
        super().__init__(
            f"request {request_id} needs {num_pages_needed} KV page(s) but the pool holds only "
            f"{capacity}; lower max_new_tokens or give the engine more pages"
        )


class RequestFailed(PageRuntimeError, RuntimeError):
    """Raised by `Engine.stream` when its request failed; `__cause__` is the original error.

    Attributes:
        request_id: The failed request.
    """

    def __init__(self, request_id: int, error: BaseException | None) -> None:
        self.request_id = request_id
        super().__init__(f"request {request_id} failed: {error!r}")
