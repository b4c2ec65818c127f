"""Fixtures for the benchmark gates. The benchmark scripts import each other as top-level modules
(they run as `python benchmarks/<tool>.py`); the root pytest config puts this folder on sys.path."""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest

# MLX's CPU buffer cache holds 32 MiB by default; one float32 gather + dense attention call of
# the gates frees 32 MiB of gathered K/V alone. Room for every call's temporaries, with margin.
GATE_CACHE_LIMIT = 1 << 30


@pytest.fixture
def on_cpu():
    """Runs a test on MLX's CPU device (the CI gates measure the CPU kernels), then restores."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture
def steady_allocator():
    """Times a test's calls with MLX's CPU buffer cache emptied and enlarged, then restores it.

    MLX recycles freed buffers only while its cache (32 MiB on CPU) has room, and never evicts
    to make room. After a long session the cache is full of buffers earlier tests left, so a
    timed call's large temporaries go back to glibc instead, which, depending on the thresholds
    the session's history left it with, unmaps them on free: then every call page-faults its
    temporaries (the float32 dense path measured 18 ms instead of 4 ms). Emptying the cache and
    giving it room for every temporary makes a call's cost independent of what ran before.
    """
    gc.collect()  # arrays earlier tests left in reference cycles
    mx.clear_cache()
    previous = mx.set_cache_limit(GATE_CACHE_LIMIT)
    yield
    mx.set_cache_limit(previous)
    mx.clear_cache()
