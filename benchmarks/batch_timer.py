"""Wall-clock timing of lazy MLX calls that are shorter than one `mx.eval` round trip.

On MLX's CUDA backend one `mx.eval` costs about 50-100 us of host work, more than a decode
kernel (a few us). So a sample evaluates N independent calls together and reports wall time / N.
The calls rotate among enough independent input copies that the bytes touched between two uses of
one copy exceed `reuse_factor` x the cache (H200 L2: 50 MB), so every call reads K/V from memory
rather than cache, as each layer of a real model would.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import mlx.core as mx

__all__ = ["GPU_L2_BYTES", "BatchPlan", "interleaved_medians", "plan_batches", "time_batches"]

GPU_L2_BYTES = 50 * 10**6
METHOD = (
    "Each sample evaluates calls_per_batch independent calls in one mx.eval between two "
    "mx.synchronize() and reports wall time / calls_per_batch (graph construction is outside the "
    "timed region). Calls rotate among `copies` independent input copies so that at least "
    "reuse_factor x cache_bytes are touched between two uses of one copy (cold cache). "
    "A process warms up first, then records `iterations` samples; its figure is their median. "
    "A cell's figure is the median of its fresh-process medians; processes run the paths in "
    "alternating order."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPlan:
    """How one cell is timed.

    Attributes:
        copies: Independent input copies the calls rotate among.
        calls_per_batch: Calls evaluated together in one sample.
    """

    copies: int
    calls_per_batch: int


def plan_batches(
    *,
    copy_bytes: int,
    transient_bytes: int,
    cache_bytes: int,
    memory_budget: int,
    max_calls: int,
    reuse_factor: int = 4,
) -> BatchPlan:
    """Chooses copies and calls per batch for a cell within a memory budget.

    Args:
        copy_bytes: Bytes of one input copy (what a call reads).
        transient_bytes: Bytes a call allocates that live until the batch is evaluated (the
            dense path's gathered K/V; the output otherwise).
        cache_bytes: The cache to defeat (GPU L2).
        memory_budget: Bytes the copies plus one batch's transients may occupy.
        max_calls: Upper bound on calls per batch.
        reuse_factor: Bytes touched between two uses of a copy, in units of `cache_bytes`.

    Returns:
        The plan; at least one copy and one call even when a single copy exceeds the budget.
    """
    if min(copy_bytes, memory_budget, max_calls, reuse_factor) < 1:
        raise ValueError(
            f"copy_bytes={copy_bytes}, memory_budget={memory_budget}, max_calls={max_calls}, "
            f"reuse_factor={reuse_factor}: all must be >= 1"
        )
    wanted = math.ceil(reuse_factor * cache_bytes / copy_bytes)
    copies = max(1, min(wanted, memory_budget // copy_bytes))
    left = memory_budget - copies * copy_bytes
    calls = max(1, min(max_calls, left // max(transient_bytes, 1)))
    return BatchPlan(copies=copies, calls_per_batch=calls)


def time_batches(
    call: Callable[[int], object], *, plan: BatchPlan, warmup: int, iterations: int
) -> list[float]:
    """Times `iterations` batches after `warmup` untimed ones.

    Args:
        call: Builds the lazy output(s) of call number i (it should use copy i % plan.copies).
        plan: Copies and calls per batch.
        warmup: Untimed batches first (kernel loading, allocator growth).
        iterations: Timed batches.

    Returns:
        Seconds per call, one value per timed batch.
    """
    numbers = itertools.count()

    def batch() -> list[object]:
        return [call(next(numbers)) for _ in range(plan.calls_per_batch)]

    for _ in range(warmup):
        mx.eval(batch())
    samples = []
    for _ in range(iterations):
        outputs = batch()
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(outputs)
        mx.synchronize()
        samples.append((time.perf_counter() - start) / plan.calls_per_batch)
        del outputs
    return samples


def interleaved_medians(
    calls: Mapping[str, Callable[[], object]], *, rounds: int, calls_per_round: int
) -> dict[str, list[float]]:
    """Times several calls against each other on a noisy machine.

    Each round times every call `calls_per_round` times (one eval each) in an order that rotates
    from round to round, so drift and neighbours' load hit all calls alike; the ratio of two
    calls' medians of round medians is then stable even when absolute times are not.

    Args:
        calls: Name -> function building the lazy output(s) of one call.
        rounds: Rounds to run (after one untimed warm-up round).
        calls_per_round: Timed evaluations per call and round.

    Returns:
        Name -> the per-round median seconds per call.
    """
    names = list(calls)
    for name in names:
        mx.eval(calls[name]())
    medians: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times = []
            for _ in range(calls_per_round):
                outputs = calls[name]()
                mx.synchronize()
                start = time.perf_counter()
                mx.eval(outputs)
                mx.synchronize()
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times))
    return medians
