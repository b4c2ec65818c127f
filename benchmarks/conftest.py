"""Fixtures for the benchmark gates. The benchmark scripts import each other as top-level modules
(they run as `python benchmarks/<tool>.py`); the root pytest config puts this folder on sys.path."""

from __future__ import annotations

import mlx.core as mx
import pytest


@pytest.fixture
def on_cpu():
    """Runs a test on MLX's CPU device (the CI gates measure the CPU kernels), then restores."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)
