"""`StepRunner`: turns a step plan into model calls, samples, and one host synchronisation.

The decode rows share one call, padded with empty rows to a batch-size bucket; each prefill
chunk is one call of a single row. Batch sizes and block-table widths are rounded up to a
power of two, capped at the largest value they can take (`max_batch_size`, and the pages of
the longest possible request or the whole pool), so a model compiled per shape sees few
shapes. A call that raises fails only its own requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from pagepool import BatchMetadata
from pageruntime.events import emit
from pageruntime.protocols import KVStore, Sampler, StepModel
from pageruntime.request import Request
from pageruntime.scheduler import ScheduledWork, StepPlan

__all__ = ["StepOutcome", "StepRunner"]


@dataclass(slots=True)
class StepOutcome:
    """What a step's model calls produced.

    Attributes:
        tokens: `(request, token)` for every sampled row, in call order.
        failures: `(requests, error)` for every call (or the synchronisation) that raised.
    """

    tokens: list[tuple[Request, int]] = field(default_factory=list)
    failures: list[tuple[list[Request], Exception]] = field(default_factory=list)


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

    def run(self, plan: StepPlan, step: int) -> StepOutcome:
        """Copy-on-write copies, the decode call, each prefill call, then one evaluation."""
        outcome = StepOutcome()
        kv_before = self._kv.snapshot()
        try:
            self._kv.copy_pages(plan.copies)
        except Exception as error:
            outcome.failures.append(([work.request for work in plan.works], error))
            return outcome
        sampled: list[tuple[list[ScheduledWork], mx.array]] = []
        calls = [(plan.decode, False)] if plan.decode else []
        calls += [([work], True) for work in plan.prefill]
        for works, is_prefill in calls:
            try:
                tokens = self._call(works, is_prefill, step)
            except Exception as error:
                outcome.failures.append(([work.request for work in works], error))
                continue
            if tokens is not None:
                sampled.append((works, tokens))
        try:
            token_ids = self._evaluate([tokens for _, tokens in sampled])
        except Exception as error:
            # The step's output arrays failed to evaluate: go back to the array objects the
            # step started from. That restores usable arrays, not data: an in-place write_kv
            # (and any copy-on-write copy) changed those same buffers. This is harmless: only
            # pages owned by this step's requests were written, and they all fail and free them.
            self._kv.restore(kv_before)
            outcome.failures.append(([work.request for work in plan.works], error))
            return outcome
        requests = [work.request for works, _ in sampled for work in works]
        outcome.tokens = list(zip(requests, token_ids, strict=True))
        return outcome

    def _call(self, works: list[ScheduledWork], is_prefill: bool, step: int) -> mx.array | None:
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
        tokens = mx.array([work.token_ids for work in works] + [(0,) * L] * padding, mx.int32)
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

    def _evaluate(self, sampled: Sequence[mx.array]) -> list[int]:
        """The step's one host synchronisation: every sampled token and the written storage."""
        tokens = mx.concatenate(list(sampled)) if sampled else mx.array([], dtype=mx.int32)
        mx.eval(tokens, *self._kv.step_arrays())
        return tokens.tolist()


def _bucket(n: int, cap: int) -> int:
    """The smallest power of two >= n, but at most `cap` (shapes repeat for `mx.compile`)."""
    return min(1 << (n - 1).bit_length(), cap)
