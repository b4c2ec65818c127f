"""`Engine`: continuous batching over a `StepModel`, its KV pages, and a sampler.

One step = plan (scheduler) -> copy-on-write copies -> one batched decode call -> one call per
prefill chunk -> one host synchronisation that samples every row -> bookkeeping and events.

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
from collections.abc import Iterable, Sequence

from pagepool import PagePool, pages_for
from pageruntime.events import emit
from pageruntime.protocols import Sampler, StepModel
from pageruntime.request import FinishReason, Request, RequestOutput, RequestState, TokenEvent
from pageruntime.runner import LaunchedStep, StepOutcome, StepRunner
from pageruntime.sampling import SamplingParams, sample_tokens
from pageruntime.scheduler import AdmissionPolicy, Scheduler, StepPlan
from pageruntime.stats import EngineStats, StatsRecorder
from pageruntime.stream import TokenStream
from pageruntime.validation import (
    check_engine_arguments,
    check_kv_store,
    check_model,
    validated_request,
)

__all__ = ["Engine"]


class Engine:
    """Serves many requests at once on a fixed pool of KV pages.

    Args:
        model: The model; the engine calls `model.make_kv_storage(pool)` once, after every
            argument was validated.
        num_pages: KV pool capacity in pages (the memory cap), >= 1.
        page_size: Tokens per page, >= 1.
        max_batch_size: Most requests running at once (the decode batch), >= 1.
        prefill_step: Prefill tokens per step, over all chunks, >= 1.
        admission: `reserve` or `optimistic` (see `AdmissionPolicy`).
        sampler: Picks tokens from logits; `sample_tokens` by default.
        overlap_decode: Launch the next decode step before synchronising on this one when
            its work is certain (see the module docstring); reserve admission only.

    Raises:
        ValueError: A size is not an int >= 1, `admission` is unknown, `overlap_decode` is
            set with optimistic admission (a preemption could drop a pending token), or the
            model's `max_seq_len` is not an int >= 1 or its `vocab_size` not an int in
            [1, 2**31].
        TypeError: `model` lacks the `StepModel` members, `sampler` is not callable,
            `overlap_decode` is not a bool, or the model's storage is not a `KVStore` over
            the engine's pool.

    An engine is not thread-safe: drive it (`step`, `stream`, `generate`) from one thread.

    Example:
        >>> from pageruntime.testing import ContextHashModel
        >>> engine = Engine(ContextHashModel(), num_pages=64, page_size=16)
        >>> engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0].output_ids
        (27, 33, 26, 56)
    """

    def __init__(
        self,
        model: StepModel,
        *,
        num_pages: int,
        page_size: int = 16,
        max_batch_size: int = 4,
        prefill_step: int = 128,
        admission: AdmissionPolicy | str = AdmissionPolicy.RESERVE,
        sampler: Sampler | None = None,
        overlap_decode: bool = False,
    ) -> None:
        # Everything is checked before `make_kv_storage`, which may allocate gigabytes.
        check_engine_arguments(
            num_pages=num_pages,
            page_size=page_size,
            max_batch_size=max_batch_size,
            prefill_step=prefill_step,
            admission=admission,
            sampler=sampler,
            overlap_decode=overlap_decode,
        )
        check_model(model)
        self._model = model
        self._max_seq_len = model.max_seq_len
        self._vocab_size = model.vocab_size
        self._pool = PagePool(page_size, num_pages)
        self._kv = model.make_kv_storage(self._pool)
        check_kv_store(self._kv, self._pool)
        self._runner = StepRunner(
            model,
            self._kv,
            sample_tokens if sampler is None else sampler,
            max_batch_size=max_batch_size,
            max_row_pages=min(pages_for(self._max_seq_len, page_size), num_pages),
        )
        self._scheduler = Scheduler(
            self._pool,
            max_batch_size=max_batch_size,
            prefill_step=prefill_step,
            admission=AdmissionPolicy(admission),
            max_seq_len=self._max_seq_len,
        )
        self._overlap_decode = overlap_decode
        self._in_flight: LaunchedStep | None = None  # launched ahead, not yet collected
        self._requests: dict[int, Request] = {}  # unfinished requests only
        self._num_submitted = 0
        self._pending: list[TokenEvent] = []  # ends that happened between steps (aborts)
        self._stats = StatsRecorder()

    @property
    def pool(self) -> PagePool:
        """The KV page pool (read it; the engine owns every page)."""
        return self._pool

    @property
    def stats(self) -> EngineStats:
        """Counters so far, with the pool's metrics."""
        return self._stats.snapshot(
            pool=self._pool.metrics(), preemptions=self._scheduler.num_preemptions
        )

    def add_request(self, prompt_ids: Iterable[int], params: SamplingParams | None = None) -> int:
        """Queue a request; it is admitted by a later `step`.

        Args:
            prompt_ids: Prompt token ids, at least one, fewer than the model's `max_seq_len`.
            params: Sampling parameters; `SamplingParams()` (greedy) by default.

        Returns:
            The request id (submission order, from 0).

        Raises:
            RequestRejected: The prompt is empty, holds something other than token ids in
                `[0, vocab_size)`, is too long for the model, a stop token is outside
                `[0, vocab_size)`, or the request could never fit in the KV pool; nothing
                was queued or allocated.
            TypeError: `params` is not a `SamplingParams`.
        """
        return self._submit(*self._validated(prompt_ids, params)).request_id

    def abort(self, request_id: int) -> bool:
        """End a request now and free its pages; the next `step` reports it as aborted.

        Returns:
            True if it was unfinished, False if it had already finished.

        Raises:
            KeyError: No request with this id was ever submitted.
        """
        if not 0 <= request_id < self._num_submitted:
            raise KeyError(
                f"no request with id {request_id} (ids so far: 0..{self._num_submitted - 1})"
            )
        request = self._requests.get(request_id)
        if request is None:
            return False
        self._pending.append(self._end(request, FinishReason.ABORTED, self._stats.steps))
        return True

    def has_unfinished(self) -> bool:
        """Whether a request is waiting or running, or an abort is still to be reported.

        So `while engine.has_unfinished(): engine.step()` sees the end of every request.
        """
        return bool(self._requests or self._pending)

    def step(self) -> list[TokenEvent]:
        """Run one scheduler step and report what happened, in order.

        Events go to the caller of the step that produced them only: the steps that `stream`
        and `generate` run report through those interfaces instead.

        Returns:
            One event per produced token (the last one of a request has `finished`), plus one
            per request that ended without a token (abort, failure).
        """
        events, _ = self._step()
        return events

    def stream(
        self, prompt_ids: Iterable[int], params: SamplingParams | None = None
    ) -> TokenStream:
        """Submit a request now and iterate over its tokens as they are produced.

        Iterating runs engine steps, so other requests keep running meanwhile. Closing the
        stream early (or leaving its `with` block) aborts the request.

        Returns:
            An iterator of token ids, with `request_id` and `close()`.

        Raises:
            RequestRejected, TypeError: As `add_request`, at call time.
            RequestFailed: While iterating, if the request failed (after its tokens so far).
        """
        request = self._submit(*self._validated(prompt_ids, params))
        return TokenStream(request, step=self._step_with_progress, abort=self.abort)

    def generate(
        self,
        prompts: Sequence[Iterable[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion and return their outputs in submission order.

        Args:
            prompts: Prompt token ids, one sequence per request.
            params: One `SamplingParams` for all, one per prompt, or None for the default.

        Returns:
            One `RequestOutput` per prompt; a failed request has `finish_reason` failed and
            its `error`.

        Raises:
            RequestRejected, TypeError: As `add_request`, before anything is queued.
            ValueError: `params` is a sequence of another length than `prompts`.
        """
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        validated = [self._validated(p, q) for p, q in zip(prompts, params, strict=True)]
        requests = [self._submit(prompt_ids, p) for prompt_ids, p in validated]
        while not all(request.finished for request in requests):
            self._step_with_progress()
        return [request.output() for request in requests]

    # -- submission ------------------------------------------------------------------------

    def _validated(
        self, prompt_ids: Iterable[int], params: SamplingParams | None
    ) -> tuple[tuple[int, ...], SamplingParams]:
        prompt, params = validated_request(
            prompt_ids, params, vocab_size=self._vocab_size, max_seq_len=self._max_seq_len
        )
        self._scheduler.check_admissible(len(prompt), params.max_new_tokens)
        return prompt, params

    def _submit(self, prompt_ids: tuple[int, ...], params: SamplingParams) -> Request:
        request = Request(self._num_submitted, prompt_ids, params, max_seq_len=self._max_seq_len)
        self._num_submitted += 1
        self._requests[request.request_id] = request
        self._scheduler.add(request)
        return request

    def _step_with_progress(self) -> None:
        events, did_work = self._step()
        if not events and not did_work:
            raise RuntimeError("internal error: the engine has unfinished requests but no work")

    # -- the step ----------------------------------------------------------------------------

    def _step(self) -> tuple[list[TokenEvent], bool]:
        started = time.perf_counter()
        launched = self._take_in_flight()
        if launched is None:
            step = self._stats.steps
            plan = self._scheduler.schedule(step)
            # Taken once planning returned: ends queued by `abort` are never lost to a failure.
            events, self._pending = self._pending, []
            events += [self._ended(request) for request in plan.finished]
            if not plan.works:
                return events, False
            try:
                launched = self._runner.launch(plan, step)
            except BaseException as error:  # an interrupt while the step was built
                self._give_up(plan, step, error, events)  # launch restored the storage
                raise
        else:
            events, self._pending = self._pending, []
        try:
            ended_ahead = self._launch_ahead(launched) if self._can_launch_ahead(launched) else []
            outcome = self._collect(launched)
        except BaseException as error:  # an interrupt while building ahead or waiting
            self._give_up(launched.plan, launched.step, error, events, launched=launched)
            raise
        step, plan = launched.step, launched.plan
        for requests, error in outcome.failures:
            for request in requests:
                request.drop_pending_output()
            events += [
                self._end(request, FinishReason.FAILED, step, error=error)
                for request in requests
                if not request.finished
            ]
        decoding = {work.request.request_id for work in plan.decode}
        decode_tokens = 0
        for request, token in outcome.tokens:
            if request.finished and not request.has_pending_output:
                continue  # aborted while the step ran, or a stop token came one step late
            decode_tokens += request.request_id in decoding
            events.append(self._add_token(request, token, step))
        events += [self._ended(request) for request in ended_ahead]
        self._stats.record_step(
            time.perf_counter() - started,
            prefill_tokens=sum(len(work.token_ids) for work in plan.prefill),
            decode_tokens=decode_tokens,
        )
        return events, True

    def _take_in_flight(self) -> LaunchedStep | None:
        """The step launched ahead, if any of its requests is still unfinished. One whose
        requests all ended meanwhile (stop tokens, aborts) is waited for and dropped: the
        caller plans afresh, so a freed slot is admitted to at once."""
        launched, self._in_flight = self._in_flight, None
        if launched is not None and all(work.request.finished for work in launched.plan.works):
            self._runner.collect(launched)  # restores the storage if it failed
            return None
        return launched

    def _can_launch_ahead(self, launched: LaunchedStep) -> bool:
        return (
            self._overlap_decode
            and not launched.failures
            and launched.submit_error is None
            and self._scheduler.next_step_is_certain(launched.plan)
        )

    def _launch_ahead(self, launched: LaunchedStep) -> list[Request]:
        """Plan and launch the step after `launched` (no admission) into `_in_flight`, its
        decode rows reading their tokens from `launched` on the device; returns the requests
        that planning ended, to report after `launched`'s tokens."""
        for work in launched.plan.decode:
            work.request.add_pending_output()
        step = launched.step + 1
        plan = self._scheduler.schedule(step, admit=False)
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

    def _give_up(
        self,
        plan: StepPlan,
        step: int,
        error: BaseException,
        events: list[TokenEvent],
        *,
        launched: LaunchedStep | None = None,
    ) -> None:
        """After an exception inside a step (an interrupt while it was built, or while the
        host waited for it): it and any step launched after it are given up. Their requests
        fail with `error`, since slots were appended for them that no page list can take
        back; `events` and these ends are kept for the next step. A given-up step that was
        submitted is waited for first (MLX would raise its failure at a later, unrelated
        synchronisation), then the storage goes back to the arrays before it."""
        for submitted in (launched, self._in_flight):
            if submitted is not None:
                self._runner.drain(submitted)
        self._in_flight = None
        if launched is not None:
            self._kv.restore(launched.kv_before)
        for work in plan.works:
            work.request.drop_pending_output()
            if not work.request.finished:
                events.append(self._end(work.request, FinishReason.FAILED, step, error=error))
        events += [self._ended(r) for r in list(self._requests.values()) if r.finished]
        self._pending = events + self._pending

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
        self._stats.record_end(request.finish_reason)
        return TokenEvent(
            request_id=request.request_id,
            token=token,
            finished=True,
            finish_reason=request.finish_reason,
            error=request.error,
        )
