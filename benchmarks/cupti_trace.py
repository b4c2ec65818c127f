"""GPU kernel events of MLX work, recorded by PyTorch's profiler (CUPTI sees MLX's graph launches).

Tracing needs PyTorch in the same environment (the lent H200 has it). It is imported only when
a trace runs, so CPU tests can import this module's users and replace `trace_events`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

__all__ = ["kernel_events", "trace_events"]


def trace_events(run: Callable[[], None]) -> list[dict]:
    """The Chrome-trace events (kernels, user annotations, ...) recorded while `run()` runs.

    `run` may open `torch.profiler.record_function` ranges; the GPU is synchronised before the
    trace ends, so every kernel `run` launched is in it.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        mx.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def kernel_events(events: list[dict]) -> list[dict]:
    """The GPU kernels among `events`, in start order (`ts`, `dur` in microseconds)."""
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
