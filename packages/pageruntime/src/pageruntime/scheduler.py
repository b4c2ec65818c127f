"""Scheduler: admission under the KV page cap, preemption, and the work of every step.

Pure host logic over `PagePool` and `PageList`: it picks the requests that run, appends their
slots, and is the only place where a request's pages are released. It never touches arrays.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from pagepool import PageCopy, PageList, PagePool
from pageruntime.errors import KVCapacityExceeded, RequestRejected
from pageruntime.events import emit
from pageruntime.request import FinishReason, Request, RequestState

__all__ = ["AdmissionPolicy", "ScheduledWork", "Scheduler", "StepPlan"]


class AdmissionPolicy(enum.StrEnum):
    """How the engine decides that a waiting request fits in the KV pool."""

    RESERVE = "reserve"
    """Admit only if prompt plus `max_new_tokens` fit beside every running reservation;
    never preempt."""
    OPTIMISTIC = "optimistic"
    """Admit when the prompt fits; when pages run out, preempt the most recently admitted
    request and recompute it later from its prompt plus its output so far."""


@dataclass(slots=True, kw_only=True)
class ScheduledWork:
    """New tokens of one request for one model call; their slots are already appended.

    Attributes:
        request: The request.
        token_ids: The `L` new tokens (a prefill chunk, or the last output token).
        copies: Copy-on-write copies storage must make before the call.
        samples: Whether the call's logits give the request's next token.
    """

    request: Request
    token_ids: tuple[int, ...]
    copies: tuple[PageCopy, ...]
    samples: bool


@dataclass(slots=True)
class StepPlan:
    """The work of one step: one batched decode call, then one call per prefill chunk.

    Attributes:
        decode: One entry per decode row, oldest request first.
        prefill: One entry per prefill chunk, in order.
        finished: Requests the scheduler ended while planning (they outgrew the pool).
    """

    decode: list[ScheduledWork] = field(default_factory=list)
    prefill: list[ScheduledWork] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)

    @property
    def works(self) -> list[ScheduledWork]:
        """Every entry, decode rows first."""
        return self.decode + self.prefill

    @property
    def copies(self) -> list[PageCopy]:
        """Every copy-on-write copy of the step."""
        return [copy for work in self.works for copy in work.copies]

    def drop(self, request: Request) -> None:
        """Forget the work of a request that was preempted after it was planned."""
        self.decode = [work for work in self.decode if work.request is not request]
        self.prefill = [work for work in self.prefill if work.request is not request]


class Scheduler:
    """Waiting and running requests, and the policy that moves them between the two.

    Args:
        pool: The fixed-capacity pool every request's pages come from.
        max_batch_size: Most running (prefilling or decoding) requests at once.
        prefill_step: Prefill tokens per step, over all chunks.
        admission: The admission policy.
        max_seq_len: The model's limit on prompt plus output tokens.
    """

    def __init__(
        self,
        pool: PagePool,
        *,
        max_batch_size: int,
        prefill_step: int,
        admission: AdmissionPolicy,
        max_seq_len: int,
    ) -> None:
        self._pool = pool
        self._max_batch_size = max_batch_size
        self._prefill_step = prefill_step
        self._admission = admission
        self._max_seq_len = max_seq_len
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # in admission order
        self._num_admissions = 0
        self.num_preemptions = 0

    def next_step_is_certain(self, plan: StepPlan) -> bool:
        """Whether the step after `plan` can be planned before `plan`'s tokens are known: it
        only decodes, its rows are every running request, none of them ends by length with
        the token `plan` samples, no admission is possible (nothing waits, or the batch is
        full), and no slot can need a preemption (reserve admission)."""
        return (
            self._admission is AdmissionPolicy.RESERVE
            and bool(plan.decode)
            and not plan.prefill
            and len(plan.decode) == len(self._running)
            and (not self._waiting or len(self._running) == self._max_batch_size)
            and not any(work.request.next_token_is_last for work in plan.decode)
        )

    def check_admissible(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise `RequestRejected` if such a request could never run, even in an empty pool."""
        if self._admission is AdmissionPolicy.RESERVE:
            needed = self._pool.pages_for(self._kv_limit(num_prompt_tokens, max_new_tokens))
            what = f"prompt ({num_prompt_tokens}) plus max_new_tokens ({max_new_tokens})"
            hint = "lower max_new_tokens, add pages, or use admission='optimistic'"
        else:
            needed = self._pool.pages_for(num_prompt_tokens)
            what = f"its prompt ({num_prompt_tokens} tokens)"
            hint = "add pages or shorten the prompt"
        if needed > self._pool.capacity:
            raise RequestRejected(
                f"{what} needs {needed} KV page(s) of {self._pool.page_size} tokens but the pool "
                f"holds {self._pool.capacity}; {hint}"
            )

    def add(self, request: Request) -> None:
        """Queue a validated request for admission."""
        self._waiting.append(request)

    def schedule(self, step: int, *, admit: bool = True, plan: StepPlan | None = None) -> StepPlan:
        """Plan a step: decode rows first, then admission, then prefill chunks under budget.

        Pages for every planned token are appended here; a request that does not fit makes
        room by preemption (optimistic policy) or fails if it outgrew the whole pool. If
        planning a request raises, that request alone fails (its pages are released and it
        is in `plan.finished` with the error); the others are planned as usual. With
        `admit=False` nobody is admitted (a step planned ahead of its predecessor's tokens).
        The work goes into `plan` (a new one by default) as it is planned, so a caller that
        sees planning interrupted knows which slots were appended.
        """
        plan = StepPlan() if plan is None else plan
        for request in [r for r in self._running if r.state is RequestState.DECODE]:
            if request.state is not RequestState.DECODE:  # preempted by an earlier row
                continue
            with self._failing_alone(request, plan, step):
                work = self._plan_tokens(request, (request.output_ids[-1],), True, plan, step)
                if work is not None:
                    plan.decode.append(work)
        if admit:
            self._admit(plan, step)
        budget = self._prefill_step
        for request in list(self._running):
            if budget == 0:
                break
            if request.state is not RequestState.PREFILL:
                continue
            with self._failing_alone(request, plan, step):
                start = request.num_computed
                stop = min(request.prefill_len, start + budget)
                last = stop == request.prefill_len
                work = self._plan_tokens(request, request.token_ids(start, stop), last, plan, step)
                if work is not None:
                    plan.prefill.append(work)
                    budget -= stop - start
        return plan

    def finish(
        self, request: Request, reason: FinishReason, step: int, error: BaseException | None = None
    ) -> None:
        """End a request: release its pages, drop it from the queues, log the event."""
        num_pages = request.release_pages()
        if request in self._running:
            self._running.remove(request)
        elif request in self._waiting:
            self._waiting.remove(request)
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.error = error
        failed = reason is FinishReason.FAILED
        emit(
            "request_failed" if failed else "request_finished",
            request,
            step,
            num_tokens=len(request.output_ids),
            num_pages=num_pages,
            level=logging.WARNING if failed else logging.INFO,
            finish_reason=str(reason),
            **({"error": repr(error)} if failed else {}),
        )

    def preempt(self, request: Request, step: int) -> None:
        """Free a running request's pages and queue it first, to be recomputed later."""
        num_pages = request.release_pages()
        self._running.remove(request)
        request.state = RequestState.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(request)
        emit(
            "request_preempted",
            request,
            step,
            num_tokens=request.num_tokens,
            num_pages=num_pages,
        )

    # -- private ---------------------------------------------------------------------------

    def _admit(self, plan: StepPlan, step: int) -> None:
        """Admit waiting requests in order while they fit (head-of-line blocking)."""
        while self._waiting and len(self._running) < self._max_batch_size:
            request = self._waiting[0]
            with self._failing_alone(request, plan, step):
                if self._fits(request):
                    self._start(request, step)
                elif self._running:
                    return
                else:  # alone in an empty pool and still too big
                    self._fail_too_big(request, request.num_tokens, plan, step)

    def _start(self, request: Request, step: int) -> None:
        """Move the head of the queue to the running set, with an empty page list."""
        self._waiting.popleft()
        request.state = RequestState.PREFILL
        request.page_list = PageList(self._pool)
        request.prefill_len = request.num_tokens
        request.admission_seq = self._num_admissions
        self._num_admissions += 1
        self._running.append(request)
        emit(
            "request_admitted",
            request,
            step,
            num_tokens=request.prefill_len,
            num_pages=self._pool.pages_for(request.prefill_len),
            num_free_pages=self._pool.num_free,
            resumed=request.num_preemptions > 0,
        )

    def _fits(self, request: Request) -> bool:
        if self._admission is AdmissionPolicy.RESERVE:
            reserved = sum(self._reservation(r) for r in self._running)
            return reserved + self._reservation(request) <= self._pool.capacity
        # Pages that admitted prefills have yet to take are promised already.
        promised = sum(
            self._pool.pages_for(r.prefill_len) - r.num_pages
            for r in self._running
            if r.state is RequestState.PREFILL
        )
        return self._pool.pages_for(request.num_tokens) <= self._pool.num_free - promised

    def _plan_tokens(
        self,
        request: Request,
        token_ids: tuple[int, ...],
        samples: bool,
        plan: StepPlan,
        step: int,
    ) -> ScheduledWork | None:
        """Append slots for `token_ids`, making room first; None if the request lost its place."""
        page_list = request.page_list
        assert page_list is not None, "a running request holds a page list"
        while not page_list.can_append(len(token_ids)):
            if self._admission is AdmissionPolicy.RESERVE:
                raise RuntimeError(
                    f"internal error: request {request.request_id} found no room although "
                    "reserve admission guarantees it"
                )
            victim = max(self._running, key=lambda r: r.admission_seq)
            if victim is request and len(self._running) == 1:
                self._fail_too_big(request, request.num_computed + len(token_ids), plan, step)
                return None
            plan.drop(victim)  # first, so a failing preemption leaves no work for it
            self.preempt(victim, step)
            if victim is request:
                return None
        appended = page_list.append(len(token_ids))
        return ScheduledWork(
            request=request,
            token_ids=token_ids,
            copies=appended.copies,
            samples=samples,
        )

    @contextlib.contextmanager
    def _failing_alone(self, request: Request, plan: StepPlan, step: int) -> Iterator[None]:
        """Fail `request` (and nothing else) if planning it raises; the step goes on."""
        try:
            yield
        except Exception as error:
            self._fail(request, error, plan, step)

    def _fail_too_big(self, request: Request, num_tokens: int, plan: StepPlan, step: int) -> None:
        error = KVCapacityExceeded(
            request.request_id, self._pool.pages_for(num_tokens), self._pool.capacity
        )
        self._fail(request, error, plan, step)

    def _fail(self, request: Request, error: Exception, plan: StepPlan, step: int) -> None:
        """End a request during planning; the engine reports it from `plan.finished`."""
        self.finish(request, FinishReason.FAILED, step, error)
        plan.finished.append(request)

    def _reservation(self, request: Request) -> int:
        """Pages a request can ever hold under the reserve policy."""
        return self._pool.pages_for(
            self._kv_limit(len(request.prompt_ids), request.params.max_new_tokens)
        )

    def _kv_limit(self, num_prompt_tokens: int, max_new_tokens: int) -> int:
        # The last output token is never fed back, so its K/V is never written.
        return min(num_prompt_tokens + max_new_tokens, self._max_seq_len) - 1
