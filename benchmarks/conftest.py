"""The benchmark scripts import each other as top-level modules (they run as
`python benchmarks/<tool>.py`); pytest's importlib mode does not put this folder on sys.path, so
the gates' conftest does."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def on_cpu():
    """Runs a test on MLX's CPU device (the CI gates measure the CPU kernels), then restores."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)
