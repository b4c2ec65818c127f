"""`StepRunner`: turns a step plan into model calls, samples, and one host synchronisation
(`launch` builds and submits a step; `collect` waits for it; `fail` and `drain` give it up).

The decode rows share one call, padded with empty rows to a batch-size bucket; each prefill
chunk is one call of a single row. Batch sizes and block-table widths are rounded up to a
power of two, capped at the largest value they can take (`max_batch_size`, and the pages of
the longest possible request or the whole pool), so a model compiled per shape sees few
shapes. A call that raises fails only its own requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from pagepool import BatchMetadata, packed_int32
from pageruntime.events import emit
from pageruntime.protocols import KVStore, Sampler, StepModel
from pageruntime.request import PENDING_TOKEN, Request
from pageruntime.scheduler import ScheduledWork, StepPlan

__all__ = ["LaunchedStep", "StepOutcome", "StepRunner"]


@dataclass(slots=True)
class StepOutcome:
    """What a step's model calls produced.

    Attributes:
        tokens: `(request, token)` for every sampled row, in call order.
        failures: `(requests, error)` for every call (or the synchronisation) that raised.
        evaluation_failed: Whether the synchronisation raised (the storage was restored to
            the arrays the step started from, and every request of the step failed).
    """

    tokens: list[tuple[Request, int]] = field(default_factory=list)
    failures: list[tuple[list[Request], Exception]] = field(default_factory=list)
    evaluation_failed: bool = False


@dataclass(slots=True, kw_only=True)
class LaunchedStep:
    """A step whose model calls are built and submitted (`mx.async_eval`), not yet
    synchronised: `StepRunner.collect` turns it into a `StepOutcome`.

    Attributes:
        plan: The step's plan.
        step: The step's index.
        kv_before: The storage's arrays before the step (restored if it fails).
        kv_after: The storage's arrays the step wrote (evaluated by `collect`).
        requests: The sampled rows' requests, in the order of `tokens`.
        rows: Each sampled request's index in `tokens`, by request id.
        tokens: The sampled tokens, int32 `[len(requests)]`, or None if nothing samples.
        failures: `(requests, error)` for every call that raised while building.
        submit_error: What `mx.async_eval` raised, if it did (`collect` fails the step).
    """

    plan: StepPlan
    step: int
    kv_before: tuple[tuple[mx.array, ...], tuple[mx.array, ...]]
    kv_after: list[mx.array] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    rows: dict[int, int] = field(default_factory=dict)
    tokens: mx.array | None = None
    failures: list[tuple[list[Request], Exception]] = field(default_factory=list)
    submit_error: Exception | None = None

    @property
    def outputs(self) -> list[mx.array]:
        """What the step computes: its sampled tokens and the storage it wrote."""
        return ([] if self.tokens is None else [self.tokens]) + self.kv_after

    def row_of(self, request: Request) -> int:
        """The index of `request`'s sampled token in `tokens`."""
        try:
            return self.rows[request.request_id]
        except KeyError:
            raise KeyError(
                f"request {request.request_id} samples no token in step {self.step}"
            ) from None


class StepRunner:
    """Runs the model calls of a plan on one KV storage.

    Args:
        model: The model.
        kv: The storage the model reads and writes.
        sampler: Picks tokens from the logits of sampling rows.
        max_batch_size: Largest decode batch (the last batch-size bucket).
        max_row_pages: Largest block-table width (the last width bucket).
    """

    def __init__(
        self,
        model: StepModel,
        kv: KVStore,
        sampler: Sampler,
        *,
        max_batch_size: int,
        max_row_pages: int,
    ) -> None:
        self._model = model
        self._kv = kv
        self._sampler = sampler
        self._max_batch_size = max_batch_size
        self._max_row_pages = max_row_pages
        self._vocab_size = model.vocab_size  # the logits width every call must return

    def launch(
        self, plan: StepPlan, step: int, previous: LaunchedStep | None = None
    ) -> LaunchedStep:
        """Build the step's copies and model calls and submit them without waiting.

        Decode rows whose token is `PENDING_TOKEN` take it from `previous.tokens` on the
        device: `previous` is the launched step that samples it.
        """
        launched = LaunchedStep(plan=plan, step=step, kv_before=self._kv.snapshot())
        try:
            self._build(launched, previous)
        except BaseException:  # an interrupt: the storage must not keep half a step
            self._kv.restore(launched.kv_before)
            raise
        return launched

    def _build(self, launched: LaunchedStep, previous: LaunchedStep | None) -> None:
        """`launch` after the snapshot: copies, calls, sampling, submission."""
        plan, step = launched.plan, launched.step
        try:
            self._kv.copy_pages(plan.copies)
        except Exception as error:
            launched.failures.append(([work.request for work in plan.works], error))
            return
        sampled: list[tuple[list[ScheduledWork], mx.array]] = []
        calls = [(plan.decode, False)] if plan.decode else []
        calls += [([work], True) for work in plan.prefill]
        for works, is_prefill in calls:
            try:
                tokens = self._call(works, is_prefill, step, previous)
            except Exception as error:
                launched.failures.append(([work.request for work in works], error))
                continue
            if tokens is not None:
                sampled.append((works, tokens))
        launched.requests = [work.request for works, _ in sampled for work in works]
        launched.rows = {request.request_id: row for row, request in enumerate(launched.requests)}
        if sampled:
            launched.tokens = mx.concatenate([tokens for _, tokens in sampled])
        launched.kv_after = self._kv.step_arrays()
        try:
            mx.async_eval(*launched.outputs)
        except Exception as error:  # some failures surface at submission already
            launched.submit_error = error

    def collect(self, launched: LaunchedStep) -> StepOutcome:
        """The step's one host synchronisation: its sampled tokens and written storage."""
        outcome = StepOutcome(failures=list(launched.failures))
        try:
            if launched.submit_error is not None:
                raise launched.submit_error
            mx.eval(*launched.outputs)
            token_ids = [] if launched.tokens is None else launched.tokens.tolist()
        except Exception as error:
            return self.fail(launched, error)
        outcome.tokens = list(zip(launched.requests, token_ids, strict=True))
        return outcome

    def drain(self, launched: LaunchedStep) -> None:
        """Wait for a launched step that is being given up, dropping its results and any
        failure: MLX would otherwise raise that failure at a later, unrelated
        synchronisation."""
        try:
            mx.eval(*launched.outputs)
        except Exception:  # the step's requests fail anyway; its error must not leak
            return

    def discard(self, launched: LaunchedStep) -> None:
        """Give up a launched step: the storage goes back to the arrays before it, and it is
        drained."""
        self._kv.restore(launched.kv_before)
        self.drain(launched)

    def fail(self, launched: LaunchedStep, error: Exception) -> StepOutcome:
        """Give up on a launched step whose arrays failed to evaluate: every request of it
        fails with `error`, and the storage goes back to the array objects the step started
        from. That restores usable arrays, not data: an in-place write_kv (and any
        copy-on-write copy) changed those same buffers. This is harmless: only pages owned by
        this step's requests were written, and they all fail and free them."""
        self._kv.restore(launched.kv_before)
        requests = [work.request for work in launched.plan.works]
        return StepOutcome(failures=[*launched.failures, (requests, error)], evaluation_failed=True)

    def _call(
        self,
        works: list[ScheduledWork],
        is_prefill: bool,
        step: int,
        previous: LaunchedStep | None,
    ) -> mx.array | None:
        """One model call for rows of equal query length; the sampled tokens, if it samples."""
        L = len(works[0].token_ids)
        B = _bucket(len(works), self._max_batch_size)
        padding = B - len(works)
        widest = max(work.request.num_pages for work in works)
        metadata = BatchMetadata.build(
            [work.request.page_list for work in works] + [None] * padding,
            query_len=L,
            max_pages=_bucket(widest, self._max_row_pages),
        )
        tokens = self._input_tokens(works, L, padding, previous)
        logits = self._model.step(tokens, metadata, self._kv)
        if tuple(logits.shape) != (B, self._vocab_size):
            raise ValueError(
                f"model.step returned logits of shape {tuple(logits.shape)}, expected "
                f"[{B}, {self._vocab_size}] ([B, vocab_size])"
            )
        if is_prefill:
            request = works[0].request
            emit(
                "prefill_chunk",
                request,
                step,
                num_tokens=L,
                context_len=request.num_computed,
            )
        if not works[0].samples:
            return None
        requests = [work.request for work in works]
        tokens = self._sampler(
            logits[: len(works)],
            [request.params for request in requests],
            [len(request.output_ids) for request in requests],
        )
        if tuple(tokens.shape) != (len(works),):
            raise ValueError(
                f"sampler returned shape {tuple(tokens.shape)}, expected ({len(works)},)"
            )
        return tokens

    @staticmethod
    def _input_tokens(
        works: list[ScheduledWork], L: int, padding: int, previous: LaunchedStep | None
    ) -> mx.array:
        """int32 `[B, L]`: the rows' tokens, pending ones read from `previous` on the device.

        With pending rows, the three host lists become views of one array (`packed_int32`): one
        managed buffer per step instead of three.
        """
        host = [work.token_ids for work in works] + [(0,) * L] * padding
        pending = [row for row, ids in enumerate(host) if ids == (PENDING_TOKEN,)]
        if not pending:
            return mx.array(host, mx.int32)
        if previous is None or previous.tokens is None:
            raise RuntimeError("internal error: a pending token without the step that samples it")
        source = [previous.row_of(works[row].request) for row in pending]
        flat, rows, sources = packed_int32([t for ids in host for t in ids], pending, source)
        tokens = flat.reshape(len(host), L)
        tokens[rows, 0] = previous.tokens[sources]
        return tokens


def _bucket(n: int, cap: int) -> int:
    """The smallest power of two >= n, but at most `cap` (shapes repeat for `mx.compile`)."""
    return min(1 << (n - 1).bit_length(), cap)
