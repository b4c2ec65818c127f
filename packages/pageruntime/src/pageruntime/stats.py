"""Engine counters for benchmarks: steps, tokens, step wall times, pages, preemptions."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pagepool import PoolMetrics
from pageruntime.request import FinishReason

__all__ = ["STEP_TIMES_KEPT", "EngineStats", "StatsRecorder"]

#: Step wall times kept (the latest ones): a serving engine runs for millions of steps.
STEP_TIMES_KEPT = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """A snapshot of what an engine has done so far.

    Attributes:
        steps: Steps that ran at least one model call.
        prefill_tokens: Tokens sent to prefill calls (recomputation included).
        decode_tokens: Tokens produced by decode calls (real rows only, no padding).
        step_times: Wall time of the last `STEP_TIMES_KEPT` counted steps (all of them in a
            shorter run), oldest first, in seconds (planning, model calls, the one host
            synchronisation, bookkeeping).
        peak_live_pages: Most KV pages live at once.
        preemptions: Requests preempted (each preemption counts once).
        requests_finished: Requests that ended with stop, length or max_seq_len.
        requests_aborted: Requests ended by `abort`.
        requests_failed: Requests that failed (model, sampler or KV capacity).
        pool: The page pool's own metrics at snapshot time.
    """

    steps: int
    prefill_tokens: int
    decode_tokens: int
    step_times: tuple[float, ...]
    peak_live_pages: int
    preemptions: int
    requests_finished: int
    requests_aborted: int
    requests_failed: int
    pool: PoolMetrics


class StatsRecorder:
    """The mutable counters behind `EngineStats` (owned by the engine)."""

    def __init__(self) -> None:
        self.steps = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self._ends = {reason: 0 for reason in FinishReason}

    def record_step(self, seconds: float, *, prefill_tokens: int, decode_tokens: int) -> None:
        """Count one step that ran model calls."""
        self.steps += 1
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        self.step_times.append(seconds)

    def record_end(self, reason: FinishReason) -> None:
        """Count one request that ended."""
        self._ends[reason] += 1

    def snapshot(self, *, pool: PoolMetrics, preemptions: int) -> EngineStats:
        """A frozen copy of the counters."""
        ends = self._ends
        return EngineStats(
            steps=self.steps,
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            step_times=tuple(self.step_times),
            peak_live_pages=pool.peak_live_pages,
            preemptions=preemptions,
            requests_finished=sum(n for reason, n in ends.items() if reason.on_token),
            requests_aborted=ends[FinishReason.ABORTED],
            requests_failed=ends[FinishReason.FAILED],
            pool=pool,
        )
