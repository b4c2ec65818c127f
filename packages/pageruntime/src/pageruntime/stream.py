"""`TokenStream`: one request's tokens, produced by running engine steps as they are needed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType

from pageruntime.errors import RequestFailed
from pageruntime.request import FinishReason, Request

__all__ = ["TokenStream"]


class TokenStream(Iterator[int]):
    """Iterates over one request's output tokens; each `next` runs engine steps until one comes.

    Other requests keep running during those steps. Closing the stream (or leaving its `with`
    block) before the request ends aborts it. If the request fails, iteration raises
    `RequestFailed` after the tokens it produced.

    Args:
        request: The engine's record of the request.
        step: Runs one engine step.
        abort: Aborts a request by id.
    """

    def __init__(
        self, request: Request, *, step: Callable[[], None], abort: Callable[[int], bool]
    ) -> None:
        self._request = request
        self._step = step
        self._abort = abort
        self._num_yielded = 0
        self._failure_raised = False

    @property
    def request_id(self) -> int:
        """The id of the streamed request (for `Engine.abort`)."""
        return self._request.request_id

    def __next__(self) -> int:
        request = self._request
        while self._num_yielded == len(request.output_ids):
            if not request.finished:
                self._step()
                continue
            if request.finish_reason is FinishReason.FAILED and not self._failure_raised:
                self._failure_raised = True
                raise RequestFailed(request.request_id, request.error) from request.error
            raise StopIteration
        self._num_yielded += 1
        return request.output_ids[self._num_yielded - 1]

    def close(self) -> None:
        """Abort the request if it has not ended; its pages return to the pool at once."""
        if not self._request.finished:
            self._abort(self._request.request_id)

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
