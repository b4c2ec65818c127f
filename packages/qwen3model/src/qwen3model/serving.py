"""The serving workload behind `qwen3model serve-bench`: a fixed trace of requests entering and
leaving a continuous batch, run once per attention variant, with the measurements of the
seed's paired serving runner (throughput, decode step times, KV memory, copies, page reuse)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from pagepool import BatchMetadata, KVStorage, PagePool, pages_for
from pageruntime import Engine, SamplingParams
from qwen3model.attention import AttentionMode
from qwen3model.dense_baseline import DenseKVStore
from qwen3model.model import Qwen3Model

__all__ = [
    "CPU_TRACE",
    "GPU_TRACE",
    "TRACE_OVERRIDES",
    "ServingResult",
    "Trace",
    "TraceRequest",
    "make_requests",
    "run_variant",
    "serve_bench_trace",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A serving workload: `num_seqs` requests with uniform random prompt and output lengths,
    all submitted at once and served `batch_size` at a time (the seed's trace by default).

    Attributes:
        num_seqs: Requests.
        batch_size: Most requests running at once.
        min_input_len: Shortest prompt, in tokens.
        max_input_len: Longest prompt.
        min_output_len: Fewest generated tokens per request.
        max_output_len: Most generated tokens per request.
        prefill_step: Prefill tokens per engine step (the chunk size).
        page_size: Tokens per KV page.
        seed: Seed of the lengths and the prompt tokens.
    """

    num_seqs: int = 16
    batch_size: int = 4
    min_input_len: int = 128
    max_input_len: int = 1024
    min_output_len: int = 32
    max_output_len: int = 128
    prefill_step: int = 128
    page_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_seqs", "batch_size", "min_input_len", "min_output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}, expected >= 1")
        for low, high in (("min_input_len", "max_input_len"), ("min_output_len", "max_output_len")):
            if getattr(self, high) < getattr(self, low):
                raise ValueError(
                    f"{high}={getattr(self, high)} is below {low}={getattr(self, low)}"
                )
        if self.prefill_step < 1 or self.page_size < 1:
            raise ValueError("prefill_step and page_size must be >= 1")

    @property
    def longest_request_pages(self) -> int:
        """Pages of one request with the longest prompt and output."""
        return pages_for(self.max_input_len + self.max_output_len, self.page_size)

    @property
    def num_pages(self) -> int:
        """Pages for `batch_size` requests of the longest prompt and output at once."""
        return self.batch_size * self.longest_request_pages


# The `Trace` fields a command line may override (the seed has a flag of its own).
TRACE_OVERRIDES = tuple(field.name for field in dataclasses.fields(Trace) if field.name != "seed")


# serve-bench's default traces: the seed's on the GPU; on CPU one that runs the three variants
# in under a minute on 2 cores.
GPU_TRACE = Trace()
CPU_TRACE = Trace(
    num_seqs=12, min_input_len=96, max_input_len=768, min_output_len=24, max_output_len=96
)


def serve_bench_trace(*, on_gpu: bool, seed: int = 0, **overrides: int | None) -> Trace:
    """serve-bench's trace: `GPU_TRACE` or `CPU_TRACE`, with every override that is not None.

    Raises:
        TypeError: An override that is not a `Trace` field.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    return dataclasses.replace(GPU_TRACE if on_gpu else CPU_TRACE, **given, seed=seed)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    """One request of a trace.

    Attributes:
        prompt_ids: Prompt token ids.
        max_new_tokens: Most tokens to generate. No stop tokens are set, so a request ends
            early only at the model's `max_seq_len`.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int


def make_requests(trace: Trace, vocab_size: int) -> list[TraceRequest]:
    """The trace's requests: lengths and prompt tokens drawn from `trace.seed` (numpy PCG64)."""
    rng = np.random.default_rng(trace.seed)
    inputs = rng.integers(trace.min_input_len, trace.max_input_len + 1, trace.num_seqs)
    outputs = rng.integers(trace.min_output_len, trace.max_output_len + 1, trace.num_seqs)
    return [
        TraceRequest(
            prompt_ids=tuple(int(t) for t in rng.integers(0, vocab_size, int(n_in))),
            max_new_tokens=int(n_out),
        )
        for n_in, n_out in zip(inputs, outputs, strict=True)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingResult:
    """Measurements of one variant on one trace.

    Attributes:
        variant: Attention path (`dense`, `gather`, `paged`); `+compile` when the paged
            decode steps ran through `mx.compile` (`Qwen3Model.compile_decode`), `+overlap`
            when the engine launched each decode step before collecting the previous one.
        num_requests: Requests served.
        prefill_tokens: Tokens prefilled (recomputation after preemption included).
        output_tokens: Tokens the engine generated (every rate counts these, never the
            requests' `max_new_tokens`).
        wall_s: Seconds from the first submission to the last token.
        prefill_tokens_per_s: Prefill tokens per second of synchronized prefill calls.
        output_tokens_per_s: Generated tokens per wall-clock second.
        decode_tokens_per_s: Decode tokens per second of synchronized decode calls (with
            overlap: of consecutive decode-only steps, each timed from its decode call to the
            next).
        requests_per_s: Requests per wall-clock second.
        decode_step_ms: Median, p95 and max of the synchronized decode calls, in ms (with
            overlap: of the decode step periods).
        decode_period_ms: Median, p95 and max of the decode step periods, in ms: the time
            between two consecutive decode calls with no prefill call between them, which
            is the engine's whole decode step, measured alike with and without overlap
            (0 when fewer than two decode calls ran back to back).
        peak_kv_bytes: Peak K/V memory: live pages x page bytes (paged, gather), or the
            live contiguous caches (dense).
        copied_bytes: K/V bytes copied outside the kernels: dense repacks or page gathers.
        pages_reused: Page allocations that reused a freed page.
        max_tail_waste_slots: Most empty slots in live tail pages seen after a call.
        preemptions: Requests preempted (optimistic admission only).
        peak_decode_rows: Most requests in one decode call (running-request concurrency).
        mean_decode_rows: Requests per decode call, averaged over the decode calls.
    """

    variant: str
    num_requests: int
    prefill_tokens: int
    output_tokens: int
    wall_s: float
    prefill_tokens_per_s: float
    output_tokens_per_s: float
    decode_tokens_per_s: float
    requests_per_s: float
    decode_step_ms: tuple[float, float, float]
    decode_period_ms: tuple[float, float, float]
    peak_kv_bytes: int
    copied_bytes: int
    pages_reused: int
    max_tail_waste_slots: int
    preemptions: int
    peak_decode_rows: int
    mean_decode_rows: float


class _TimedModel:
    """A `StepModel` proxy that times every call (the benchmark's probe).

    It synchronizes and times each call, except decode calls when `overlapped` (the engine
    launches a decode step before the previous one is collected, and a synchronisation here
    would serialise them): then a decode step's time is its period. In every mode it also
    records decode step periods: the interval between two consecutive decode calls with no
    prefill call between them, the engine's whole step (planning, calls, synchronisation,
    bookkeeping), measured the same way with and without overlap."""

    def __init__(self, model: Qwen3Model, *, overlapped: bool = False) -> None:
        self.model = model
        self.overlapped = overlapped
        self.prefill_s = 0.0
        self.decode_times: list[float] = []  # synchronised decode calls (not overlapped)
        self.decode_rows: list[int] = []  # live (unpadded) rows of each of those calls
        self.decode_periods: list[float] = []  # between consecutive decode calls' starts
        self.period_rows: list[int] = []  # live rows of the call each period starts with
        self.max_tail_waste = 0
        self.pool: PagePool | None = None
        self.kv: KVStorage | DenseKVStore | None = None
        self._last_decode: tuple[float, int] | None = None  # (start, rows) of the last call

    @property
    def max_seq_len(self) -> int:
        return self.model.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def make_kv_storage(self, pool: PagePool) -> KVStorage | DenseKVStore:
        self.pool, self.kv = pool, self.model.make_kv_storage(pool)
        return self.kv

    def step(
        self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage | DenseKVStore
    ) -> mx.array:
        if metadata.query_len > 1:
            self._last_decode = None  # a prefill call ends the run of decode-only steps
            if self.overlapped:
                mx.eval(kv.step_arrays())  # the decode call launched before this one
            logits, elapsed = self._synchronised_step(tokens, metadata, kv)
            self.prefill_s += elapsed
            return logits
        rows = sum(n > 0 for n in metadata.context_lens_host)
        self._record_period(rows)
        if self.overlapped:  # timed by its period only: waiting here would undo the overlap
            return self._step_and_track(tokens, metadata, kv)
        logits, elapsed = self._synchronised_step(tokens, metadata, kv)
        self.decode_times.append(elapsed)
        self.decode_rows.append(rows)
        return logits

    def _synchronised_step(
        self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage | DenseKVStore
    ) -> tuple[mx.array, float]:
        """The call and its evaluation (logits and written storage), and the seconds they took."""
        start = time.perf_counter()
        logits = self._step_and_track(tokens, metadata, kv)
        mx.eval(logits, *kv.step_arrays())
        return logits, time.perf_counter() - start

    def _record_period(self, rows: int) -> None:
        now = time.perf_counter()
        if self._last_decode is not None:
            previous_start, previous_rows = self._last_decode
            self.decode_periods.append(now - previous_start)
            self.period_rows.append(previous_rows)
        self._last_decode = (now, rows)

    def _step_and_track(
        self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage | DenseKVStore
    ) -> mx.array:
        logits = self.model.step(tokens, metadata, kv)
        assert self.pool is not None
        self.max_tail_waste = max(self.max_tail_waste, self.pool.metrics().tail_waste_slots)
        return logits


def run_variant(
    model: Qwen3Model,
    variant: AttentionMode,
    trace: Trace,
    requests: Sequence[TraceRequest],
    *,
    admission: str = "reserve",
    num_pages: int | None = None,
    overlap_decode: bool = False,
    on_token: Callable[[], None] | None = None,
) -> ServingResult:
    """Serves `requests` on a fresh engine with `model` switched to `variant`.

    Args:
        model: The model (its attention mode is set to `variant` for the run).
        variant: Attention path.
        trace: Batch size, prefill step and page size of the engine.
        requests: What to serve (see `make_requests`).
        admission: Engine admission policy.
        num_pages: KV pool capacity (default `trace.num_pages`).
        overlap_decode: Run the engine with `overlap_decode` (reserve admission only).
        on_token: Called after every generated token (progress bars).

    Raises:
        RuntimeError: A request failed.
    """
    model.attention_mode = AttentionMode(variant)
    timed = _TimedModel(model, overlapped=overlap_decode)
    engine = Engine(
        timed,
        num_pages=trace.num_pages if num_pages is None else num_pages,
        page_size=trace.page_size,
        max_batch_size=trace.batch_size,
        prefill_step=trace.prefill_step,
        admission=admission,
        overlap_decode=overlap_decode,
    )
    copied_before = model.copied_bytes
    start = time.perf_counter()
    for request in requests:
        engine.add_request(
            request.prompt_ids, SamplingParams(max_new_tokens=request.max_new_tokens)
        )
    output_tokens = 0  # counted as generated: a request may end before max_new_tokens
    while engine.has_unfinished():
        for event in engine.step():
            if event.error is not None:
                raise RuntimeError(f"request {event.request_id} failed: {event.error}")
            if event.token is not None:
                output_tokens += 1
                if on_token is not None:
                    on_token()
    wall = time.perf_counter() - start
    stats = engine.stats
    assert timed.kv is not None
    if isinstance(timed.kv, DenseKVStore):
        peak_kv = timed.kv.peak_nbytes
    else:
        page_bytes = timed.kv.nbytes // max(timed.kv.num_pages, 1)
        peak_kv = stats.pool.peak_live_pages * page_bytes
    label = model.attention_mode.value
    if model.compile_decode and model.attention_mode is AttentionMode.PAGED:
        label += "+compile"
    if overlap_decode:
        label += "+overlap"
    # Overlapped decode calls are not synchronised one by one: their periods time them.
    times, rows = (
        (timed.decode_periods, timed.period_rows)
        if overlap_decode
        else (timed.decode_times, timed.decode_rows)
    )
    return ServingResult(
        variant=label,
        num_requests=len(requests),
        prefill_tokens=stats.prefill_tokens,
        output_tokens=output_tokens,
        wall_s=wall,
        prefill_tokens_per_s=stats.prefill_tokens / max(timed.prefill_s, 1e-9),
        output_tokens_per_s=output_tokens / wall,
        decode_tokens_per_s=sum(rows) / max(sum(times), 1e-9),
        requests_per_s=len(requests) / wall,
        decode_step_ms=_median_p95_max(times),
        decode_period_ms=_median_p95_max(timed.decode_periods),
        peak_kv_bytes=peak_kv,
        copied_bytes=model.copied_bytes - copied_before,
        pages_reused=stats.pool.num_reused_allocations,
        max_tail_waste_slots=timed.max_tail_waste,
        preemptions=stats.preemptions,
        peak_decode_rows=max(rows, default=0),
        mean_decode_rows=statistics.fmean(rows) if rows else 0.0,
    )


def _median_p95_max(seconds: Sequence[float]) -> tuple[float, float, float]:
    """Median, p95 and max of `seconds`, in ms (zeros when there are none)."""
    ms = sorted(1000 * t for t in seconds) or [0.0]
    return statistics.median(ms), ms[min(len(ms) - 1, int(0.95 * len(ms)))], ms[-1]
