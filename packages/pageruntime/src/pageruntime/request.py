"""Requests: the mutable state of one request inside the engine, and the records it reports.

A request's tokens are its prompt followed by its output. Its `PageList` holds the K/V of the
first `num_computed` of them; the engine grows it by prefill chunks, then by one token per
decode step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pagepool import PageList
from pageruntime.sampling import SamplingParams

__all__ = [
    "PENDING_TOKEN",
    "FinishReason",
    "Request",
    "RequestOutput",
    "RequestState",
    "TokenEvent",
]

PENDING_TOKEN = -1
"""Stands for an output token that a step still running on the device will produce (see
`Request.add_pending_output`); never a token id."""


class FinishReason(enum.StrEnum):
    """Why a request ended."""

    STOP = "stop"
    """It generated one of its stop tokens."""
    LENGTH = "length"
    """It generated `max_new_tokens` tokens."""
    MAX_SEQ_LEN = "max_seq_len"
    """Prompt plus output reached the model's `max_seq_len`."""
    ABORTED = "aborted"
    """`Engine.abort` ended it."""
    FAILED = "failed"
    """The model, the sampler or the KV capacity failed it; the event carries the error."""

    @property
    def on_token(self) -> bool:
        """Whether the request ended with a token it generated (stop, length, max_seq_len)."""
        return self in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.MAX_SEQ_LEN)


class RequestState(enum.StrEnum):
    """Where a request is in the engine."""

    WAITING = "waiting"
    """Queued for admission (new, or preempted and waiting to be recomputed)."""
    PREFILL = "prefill"
    """Admitted; its prompt (plus any earlier output) is being prefilled in chunks."""
    DECODE = "decode"
    """Generating one token per step."""
    FINISHED = "finished"
    """Ended; its pages are back in the pool."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEvent:
    """One thing that happened to a request during `Engine.step`.

    Attributes:
        request_id: The request.
        token: The token it produced, or None when it ended without one (abort, failure).
        finished: Whether the request ended with this event.
        finish_reason: Why it ended, when `finished`.
        error: The exception that failed it, when `finish_reason` is `failed`.
    """

    request_id: int
    token: int | None
    finished: bool
    finish_reason: FinishReason | None = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestOutput:
    """The result of one finished request.

    Attributes:
        request_id: The request.
        prompt_ids: Its prompt token ids.
        output_ids: The tokens it generated, a stop token included.
        finish_reason: Why it ended.
        error: The exception that failed it, when `finish_reason` is `failed`.
        num_preemptions: How often it was preempted and recomputed.
    """

    request_id: int
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    error: BaseException | None = None
    num_preemptions: int = 0


class Request:
    """The engine's mutable record of one request (owned by the engine, never shared).

    Args:
        request_id: Unique id, in submission order.
        prompt_ids: Prompt token ids (validated by the engine).
        params: Sampling parameters.
        max_seq_len: The model's limit on prompt plus output tokens.
    """

    def __init__(
        self,
        request_id: int,
        prompt_ids: tuple[int, ...],
        params: SamplingParams,
        *,
        max_seq_len: int,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.max_seq_len = max_seq_len
        self.output_ids: list[int] = []
        self.state = RequestState.WAITING
        self.page_list: PageList | None = None
        # Tokens to prefill since the latest admission: the prompt plus any output so far.
        self.prefill_len = 0
        # Order of the latest admission; the most recently admitted request is preempted first.
        self.admission_seq = -1
        self.finish_reason: FinishReason | None = None
        self.error: BaseException | None = None
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_computed(self) -> int:
        """Tokens whose K/V are in the request's pages."""
        return 0 if self.page_list is None else self.page_list.context_len

    @property
    def num_pages(self) -> int:
        """Pages the request holds."""
        return 0 if self.page_list is None else len(self.page_list.page_ids)

    @property
    def finished(self) -> bool:
        """Whether the request has ended."""
        return self.state is RequestState.FINISHED

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        """Tokens `start .. stop - 1` of prompt followed by output."""
        return (self.prompt_ids + tuple(self.output_ids))[start:stop]

    @property
    def next_token_is_last(self) -> bool:
        """Whether the next output token ends the request by length, whatever it is."""
        return (
            len(self.output_ids) + 1 >= self.params.max_new_tokens
            or self.num_tokens + 1 >= self.max_seq_len
        )

    @property
    def has_pending_output(self) -> bool:
        """Whether the last output token is still `PENDING_TOKEN`."""
        return bool(self.output_ids) and self.output_ids[-1] == PENDING_TOKEN

    def add_pending_output(self) -> None:
        """Count the token that a launched, unsynchronised decode step will produce, so the
        next step can be planned before it is known (its slot follows this one)."""
        if self.state is not RequestState.DECODE or self.has_pending_output:
            raise RuntimeError(
                f"internal error: request {self.request_id} ({self.state}) cannot take a "
                "pending output token"
            )
        self.output_ids.append(PENDING_TOKEN)

    def drop_pending_output(self) -> None:
        """Forget the pending output token, if any (before its real value is added, or when
        its step failed)."""
        if self.has_pending_output:
            self.output_ids.pop()

    def add_output(self, token: int) -> FinishReason | None:
        """Append a generated token; return why the request must end now, if it must."""
        self.output_ids.append(token)
        if token in self.params.stop_token_ids:
            return FinishReason.STOP
        if len(self.output_ids) >= self.params.max_new_tokens:
            return FinishReason.LENGTH
        if self.num_tokens >= self.max_seq_len:
            return FinishReason.MAX_SEQ_LEN
        return None

    def release_pages(self) -> int:
        """Return every page to the pool (the engine's one release path); return how many."""
        if self.page_list is None:
            return 0
        num_pages = self.num_pages
        self.page_list.release()
        self.page_list = None
        return num_pages

    def output(self) -> RequestOutput:
        """The result record of a finished request."""
        if self.finish_reason is None:
            raise RuntimeError(f"request {self.request_id} has not finished")
        return RequestOutput(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            output_ids=tuple(self.output_ids),
            finish_reason=self.finish_reason,
            error=self.error,
            num_preemptions=self.num_preemptions,
        )

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id}, state={self.state}, prompt={len(self.prompt_ids)}, "
            f"output={len(self.output_ids)}, pages={self.num_pages})"
        )
