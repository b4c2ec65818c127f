"""Presenting serve-bench results: a rich table (one column per variant) and a JSON document."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from qwen3model.serving import ServingResult, Trace

__all__ = ["render_table", "write_json"]


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


_ROWS: list[tuple[str, Callable[[ServingResult], str]]] = [
    ("prefill tok/s", lambda r: f"{r.prefill_tokens_per_s:,.0f}"),
    ("output tok/s", lambda r: f"{r.output_tokens_per_s:,.1f}"),
    ("decode tok/s", lambda r: f"{r.decode_tokens_per_s:,.1f}"),
    ("requests/s", lambda r: f"{r.requests_per_s:.3f}"),
    ("decode step ms median", lambda r: f"{r.decode_step_ms[0]:.2f}"),
    ("decode step ms p95", lambda r: f"{r.decode_step_ms[1]:.2f}"),
    ("decode step ms max", lambda r: f"{r.decode_step_ms[2]:.2f}"),
    ("decode step period ms median", lambda r: f"{r.decode_period_ms[0]:.2f}"),
    ("wall time s", lambda r: f"{r.wall_s:.1f}"),
    ("peak KV memory", lambda r: _bytes(r.peak_kv_bytes)),
    ("K/V bytes copied", lambda r: _bytes(r.copied_bytes)),
    ("pages reused", lambda r: str(r.pages_reused)),
    ("max tail waste (slots)", lambda r: str(r.max_tail_waste_slots)),
    ("preemptions", lambda r: str(r.preemptions)),
]


def render_table(
    results: Sequence[ServingResult], *, title: str, console: Console | None = None
) -> None:
    """Prints one column per variant; adds "bytes not copied vs dense" when dense ran.

    "K/V bytes copied" counts the dense path's repacks and the gather path's gathers.
    """
    table = Table(title=title, title_justify="left")
    table.add_column("metric", no_wrap=True)
    for result in results:
        table.add_column(result.variant, justify="right")
    for name, cell in _ROWS:
        table.add_row(name, *(cell(r) for r in results))
    dense = next((r for r in results if r.variant == "dense"), None)
    if dense is not None:
        saved = [_bytes(dense.copied_bytes - r.copied_bytes) for r in results]
        table.add_row("bytes not copied vs dense", *saved)
    (console or Console()).print(table)


def write_json(
    path: str | Path,
    results: Sequence[ServingResult],
    *,
    trace: Trace,
    context: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> None:
    """Writes `{"trace", "context", "provenance", "results"}` (bytes and seconds raw);
    `provenance` sits at the top level, as in every results JSON of the project."""
    document = {
        "trace": dataclasses.asdict(trace),
        "context": dict(context),
        "provenance": dict(provenance),
        "results": [dataclasses.asdict(r) for r in results],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
