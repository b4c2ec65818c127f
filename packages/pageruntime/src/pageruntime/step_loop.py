"""`StepLoop`: the engine's running side, from a request's submission to its end. One step:
plan (scheduler) -> launch (copies, model calls, sampling, submission) -> collect (the one host
synchronisation) -> record tokens and ends -> report events.

With `overlap_decode`, a decode-only step whose successor is certain (the same requests, none
ending by length, no admission possible) launches that successor before it synchronises: the
next step's tokens are read on the device from this step's samples, and the host plans and
builds step n + 1 while the device still runs step n. Each request's tokens are those of
synchronous steps; what can differ is when things happen:

- a request that samples a stop token has one decode row computed past its end, which is
  discarded, and a request submitted while a step is in flight is admitted one step later;
- MLX raises an evaluation failure at whichever synchronisation or submission comes next, so
  a failure of either step fails both (the step ahead holds the same requests): a request may
  fail one token earlier than without overlap, and never reports a token of a failed step. A
  row computed past a request's end (after its stop token or an abort) that fails, in the
  model or the sampler, fails the other requests of that step too;
- an exception inside a step (an interrupt while it is built or waited for) fails the
  requests of that step and of the step ahead, and the engine goes on;
- scheduler events of the step planned ahead carry step n + 1 and come before step n's ends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pageruntime.events import emit
from pageruntime.request import FinishReason, Request, RequestState, TokenEvent
from pageruntime.runner import LaunchedStep, StepOutcome, StepRunner
from pageruntime.scheduler import Scheduler, StepPlan
from pageruntime.stats import StatsRecorder

__all__ = ["StepLoop"]


class StepLoop:
    """The requests an engine serves, between submission and end, and the steps serving them.

    Args:
        scheduler: Plans every step and owns every request's pages.
        runner: Runs a plan's model calls on the engine's storage.
        overlap_decode: Launch a certain next decode step before collecting this one.

    Attributes:
        stats: The engine's counters.
    """

    def __init__(self, scheduler: Scheduler, runner: StepRunner, *, overlap_decode: bool) -> None:
        self._scheduler = scheduler
        self._runner = runner
        self._overlap_decode = overlap_decode
        self.stats = StatsRecorder()
        self._requests: dict[int, Request] = {}  # unfinished requests only
        self._pending: list[TokenEvent] = []  # ends that happened between steps (aborts)
        self._in_flight: LaunchedStep | None = None  # launched ahead, not yet collected

    def add(self, request: Request) -> None:
        """Queue a validated request for admission."""
        self._requests[request.request_id] = request
        self._scheduler.add(request)

    def unfinished(self, request_id: int) -> Request | None:
        """The request with this id, if it has not ended."""
        return self._requests.get(request_id)

    def abort(self, request: Request) -> None:
        """End an unfinished request now; the next step reports it."""
        self._pending.append(self._end(request, FinishReason.ABORTED, self.stats.steps))

    def has_unfinished(self) -> bool:
        """Whether a request is waiting or running, or an end is still to be reported."""
        return bool(self._requests or self._pending)

    def step(self) -> tuple[list[TokenEvent], bool]:
        """Run one step; its events, and whether it ran a model call."""
        progress = _StepProgress(started=time.perf_counter())
        try:
            return self._run_step(progress)
        except BaseException as error:  # an interrupt anywhere in the step, say
            self._give_up(progress, error)
            raise

    def _run_step(self, progress: _StepProgress) -> tuple[list[TokenEvent], bool]:
        events = progress.events
        events += self._pending
        self._pending = []
        launched = self._take_in_flight()
        if launched is None:
            step = self.stats.steps
            progress.plans.append(plan := StepPlan())
            self._scheduler.schedule(step, plan=plan)
            events += [self._ended(request) for request in plan.finished]
            if not plan.works:
                return events, False
            launched = self._runner.launch(plan, step)
        else:
            progress.plans.append(launched.plan)
        progress.launched = launched
        ended_ahead = (
            self._launch_ahead(launched, progress) if self._can_launch_ahead(launched) else []
        )
        outcome = self._collect(launched)
        progress.collected = True
        step, plan = launched.step, launched.plan
        for requests, error in outcome.failures:
            events += self._fail(requests, error, step)
        decoding = {work.request.request_id for work in plan.decode}
        decode_tokens = 0
        for request, token in outcome.tokens:
            if request.finished and not request.has_pending_output:
                continue  # aborted while the step ran, or a stop token came one step late
            decode_tokens += request.request_id in decoding
            events.append(self._add_token(request, token, step))
            progress.recorded.add(request.request_id)
        events += [self._ended(request) for request in ended_ahead]
        if not self._requests:  # the last requests ended: nothing will collect the step ahead
            self._in_flight = self._take_in_flight()
        self.stats.record_step(
            time.perf_counter() - progress.started,
            prefill_tokens=sum(len(work.token_ids) for work in plan.prefill),
            decode_tokens=decode_tokens,
        )
        return events, True

    def _take_in_flight(self) -> LaunchedStep | None:
        """The step launched ahead, if any of its requests is still unfinished. One whose
        requests all ended meanwhile (stop tokens, aborts) is dropped: the storage goes back
        to the arrays before it and it is waited for (its failure, if any, must not surface
        later), and the caller plans afresh, so a freed slot is admitted to at once."""
        launched, self._in_flight = self._in_flight, None
        if launched is not None and all(work.request.finished for work in launched.plan.works):
            self._runner.discard(launched)
            return None
        return launched

    def _can_launch_ahead(self, launched: LaunchedStep) -> bool:
        return (
            self._overlap_decode
            and not launched.failures
            and launched.submit_error is None
            and self._scheduler.next_step_is_certain(launched.plan)
        )

    def _launch_ahead(self, launched: LaunchedStep, progress: _StepProgress) -> list[Request]:
        """Plan and launch the step after `launched` (no admission) into `_in_flight`, its
        decode rows reading their tokens from `launched` on the device; returns the requests
        that planning ended, to report after `launched`'s tokens."""
        for work in launched.plan.decode:
            work.request.add_pending_output()
        step = launched.step + 1
        progress.plans.append(plan := StepPlan())
        self._scheduler.schedule(step, admit=False, plan=plan)
        if plan.works:
            self._in_flight = self._runner.launch(plan, step, previous=launched)
        return plan.finished

    def _collect(self, launched: LaunchedStep) -> StepOutcome:
        """`launched`'s outcome; gives up the step ahead if `launched` failed."""
        ahead = self._in_flight
        if ahead is not None and ahead.submit_error is not None:
            # MLX may raise a failure of `launched` only when a step that reads its arrays is
            # submitted: then `launched`'s own results cannot be trusted either.
            outcome = self._runner.fail(launched, ahead.submit_error)
        else:
            outcome = self._runner.collect(launched)
        if outcome.evaluation_failed and self._in_flight is not None:
            # The step ahead was built on the failed step's storage and holds only its
            # requests: give it up too (the storage is back to its state before both).
            self._runner.drain(self._in_flight)
            self._in_flight = None
        return outcome

    def _give_up(self, progress: _StepProgress, error: BaseException) -> None:
        """After an exception escaped a step (an interrupt while it was planned, built,
        waited for or recorded): the step and any step launched after it are given up.

        The storage goes back to the arrays before the first step given up (the step, or
        only the step ahead once the step was collected), then submitted steps are waited
        for (MLX would raise their failures at a later, unrelated synchronisation). Every
        request with slots appended for a token that will not be recorded fails with `error`
        (no page list can take slots back); requests whose token was recorded and that have
        no row in a step ahead go on. Events so far and every end not yet reported are kept
        for the next step."""
        launched, ahead = progress.launched, self._in_flight
        self._in_flight = None
        given_up = [ahead] if progress.collected else [launched, ahead]
        # Latest first, so the storage ends at the arrays before the first step given up.
        for submitted in reversed([s for s in given_up if s is not None]):
            self._runner.discard(submitted)
        step = self.stats.steps if launched is None else launched.step
        this_step, *planned_ahead = progress.plans or [StepPlan()]
        broken = [
            w.request for w in this_step.works if w.request.request_id not in progress.recorded
        ]
        broken += [work.request for plan in planned_ahead for work in plan.works]
        events = progress.events + self._fail(broken, error, step)
        # Ends whose report the exception cut short: a request that ended on a token
        # (stop, length, max_seq_len) reports it with its end.
        for request in [r for r in self._requests.values() if r.finished]:
            on_token = request.finish_reason.on_token
            events.append(self._ended(request, request.output_ids[-1] if on_token else None))
        self._pending = events + self._pending

    def _fail(
        self, requests: Sequence[Request], error: BaseException, step: int
    ) -> list[TokenEvent]:
        """Fail every unfinished one of `requests` with `error`, dropping pending tokens."""
        events = []
        for request in requests:
            request.drop_pending_output()
            if not request.finished:
                events.append(self._end(request, FinishReason.FAILED, step, error=error))
        return events

    def _add_token(self, request: Request, token: int, step: int) -> TokenEvent:
        request.drop_pending_output()
        if request.finished:
            # It failed while the step after this one was planned: this step's token still
            # counts, and its failure is reported after it.
            request.output_ids.append(token)
            return TokenEvent(request_id=request.request_id, token=token, finished=False)
        reason = request.add_output(token)
        if request.state is RequestState.PREFILL:
            request.state = RequestState.DECODE
            if len(request.output_ids) == 1:
                emit(
                    "first_token",
                    request,
                    step,
                    token=token,
                    num_tokens=request.num_tokens,
                )
        if reason is not None:
            return self._end(request, reason, step, token=token)
        return TokenEvent(request_id=request.request_id, token=token, finished=False)

    # -- ends: every finished request passes through `_end` or `_ended` ----------------------

    def _end(
        self,
        request: Request,
        reason: FinishReason,
        step: int,
        *,
        token: int | None = None,
        error: BaseException | None = None,
    ) -> TokenEvent:
        self._scheduler.finish(request, reason, step, error)
        return self._ended(request, token)

    def _ended(self, request: Request, token: int | None = None) -> TokenEvent:
        """Forget a request the scheduler has finished; its final event."""
        del self._requests[request.request_id]
        assert request.finish_reason is not None
        self.stats.record_end(request.finish_reason)
        return TokenEvent(
            request_id=request.request_id,
            token=token,
            finished=True,
            finish_reason=request.finish_reason,
            error=request.error,
        )


@dataclass(slots=True, kw_only=True)
class _StepProgress:
    """How far one `StepLoop.step` got, for giving it up cleanly if an exception escapes.

    Attributes:
        started: `time.perf_counter()` at the step's start.
        events: The events the step has to report so far.
        plans: The step's plan, then the plan of the step ahead, as soon as each is begun.
        launched: The step being run (built this step or launched ahead by the last one).
        collected: Whether `launched`'s outcome is in (its storage is then the engine's).
        recorded: Ids of the requests whose token of `launched` has been recorded.
    """

    started: float
    events: list[TokenEvent] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)
    launched: LaunchedStep | None = None
    collected: bool = False
    recorded: set[int] = field(default_factory=set)
