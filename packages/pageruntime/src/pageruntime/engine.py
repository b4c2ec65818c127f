"""`Engine`: continuous batching over a `StepModel`, its KV pages, and a sampler.

One step = plan (scheduler) -> copy-on-write copies -> one batched decode call -> one call per
prefill chunk -> one host synchronisation that samples every row -> bookkeeping and events.

With `overlap_decode`, a decode-only step whose successor is certain launches that successor
before it synchronises (see `pageruntime.step_loop`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagepool import PagePool, pages_for
from pageruntime.protocols import Sampler, StepModel
from pageruntime.request import Request, RequestOutput, TokenEvent
from pageruntime.runner import StepRunner
from pageruntime.sampling import SamplingParams, sample_tokens
from pageruntime.scheduler import AdmissionPolicy, Scheduler
from pageruntime.stats import EngineStats
from pageruntime.step_loop import StepLoop
from pageruntime.stream import TokenStream
from pageruntime.validation import (
    as_int,
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
        self._max_seq_len = model.max_seq_len
        self._vocab_size = model.vocab_size
        self._pool = PagePool(page_size, num_pages)
        kv = model.make_kv_storage(self._pool)
        check_kv_store(kv, self._pool)
        runner = StepRunner(
            model,
            kv,
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
        self._loop = StepLoop(self._scheduler, runner, overlap_decode=overlap_decode)
        self._num_submitted = 0

    @property
    def pool(self) -> PagePool:
        """The KV page pool (read it; the engine owns every page)."""
        return self._pool

    @property
    def stats(self) -> EngineStats:
        """Counters so far, with the pool's metrics."""
        return self._loop.stats.snapshot(
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
            TypeError: `request_id` is not an integer (NumPy's count; a bool does not).
            KeyError: No request with this id was ever submitted.
        """
        index = None if isinstance(request_id, bool) else as_int(request_id)
        if index is None:
            raise TypeError(f"request_id must be an int, got {request_id!r}")
        request_id = index
        if not 0 <= request_id < self._num_submitted:
            raise KeyError(
                f"no request with id {request_id} (ids so far: 0..{self._num_submitted - 1})"
            )
        request = self._loop.unfinished(request_id)
        if request is None:
            return False
        self._loop.abort(request)
        return True

    def has_unfinished(self) -> bool:
        """Whether a request is waiting or running, or an abort is still to be reported.

        So `while engine.has_unfinished(): engine.step()` sees the end of every request.
        """
        return self._loop.has_unfinished()

    def step(self) -> list[TokenEvent]:
        """Run one scheduler step and report what happened, in order.

        Events go to the caller of the step that produced them only: the steps that `stream`
        and `generate` run report through those interfaces instead.

        Returns:
            One event per produced token (the last one of a request has `finished`), plus one
            per request that ended without a token (abort, failure).
        """
        events, _ = self._loop.step()
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
        self._loop.add(request)
        return request

    def _step_with_progress(self) -> None:
        events, did_work = self._loop.step()
        if not events and not did_work:
            raise RuntimeError("internal error: the engine has unfinished requests but no work")
