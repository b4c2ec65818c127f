"""Turns the attention benchmark's per-process records into cells, figures and a summary table.

A record is one (process, path, shape) line from `attention_worker`. A cell gathers the records
of one (path, shape); its figure is the median of the processes' medians, and its bandwidth is
the bytes the operation must move over that time (design notes §0: decode is bound by K/V reads).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from attention_workload import Shape

__all__ = ["aggregate", "summary_rows", "format_table"]

# A cell takes the first of these that any of its processes reported (repeats use other seeds:
# a kernel wrong on some inputs fails one process only).
_STATUS_BY_SEVERITY = ("gate_failed", "error", "ok")

_PROCESS_FIELDS = (
    "repeat",
    "order",
    "seed",
    "copies",
    "calls_per_batch",
    "median_us",
    "samples_us",
    "gate",
    "cell_seconds",
    "status",
    "error",
)


def aggregate(records: Iterable[dict]) -> list[dict]:
    """Groups per-process records by (path, shape) and computes each cell's figures.

    Returns:
        Cells sorted by op, page size, batch, context, path. Each has `path`, `shape`,
        `status` ("ok" only when every process timed it; else the worst status among them:
        a correctness gate failed in any process, then an error), and for ok cells only (the
        tables print no figure for a failed one) `median_us` (median of the processes'
        medians), `spread_us` (min/max process median), `*_gbps` (bytes / median time) and
        `tflops` for attention; every cell has `*_bytes` and `processes` with every sample.
    """
    groups: dict[tuple[str, tuple], list[dict]] = defaultdict(list)
    for record in records:
        shape = Shape(**record["shape"])
        groups[(record["path"], tuple(sorted(shape.to_dict().items())))].append(record)
    cells = []
    for (path, key), group in groups.items():
        shape = Shape(**dict(key))
        timed = [r for r in group if r["status"] == "ok"]
        cell: dict = {"path": path, "label": shape.label(), "shape": shape.to_dict()}
        statuses = {r["status"] for r in group}
        cell["status"] = next(s for s in _STATUS_BY_SEVERITY if s in statuses)
        cell["processes"] = [{f: r[f] for f in _PROCESS_FIELDS if f in r} for r in group]
        bytes_moved = group[-1].get("bytes", {})
        cell.update(bytes_moved)
        if cell["status"] == "ok":
            medians = [r["median_us"] for r in timed]
            seconds = statistics.median(medians) * 1e-6
            cell["median_us"] = seconds * 1e6
            cell["spread_us"] = [min(medians), max(medians)]
            for name, value in bytes_moved.items():
                cell[name.replace("_bytes", "_gbps")] = value / seconds / 1e9
            if path in ("paged", "dense", "sdpa"):
                cell["tflops"] = shape.flops / seconds / 1e12
        cells.append(cell)
    order = {"dense": 0, "gather": 1, "paged": 2, "sdpa": 3, "write": 4, "write_functional": 5}
    cells.sort(
        key=lambda c: (
            c["shape"]["query_len"] > 1,
            c["shape"]["dtype"],
            c["shape"]["page_size"],
            c["shape"]["batch"],
            c["shape"]["context"],
            order.get(c["path"], 9),
        )
    )
    return cells


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if a is None or b is None or "median_us" not in a or "median_us" not in b:
        return None
    return a["median_us"] / b["median_us"]


def summary_rows(cells: list[dict]) -> list[dict]:
    """One row per shape: each path's time and bandwidth, paged/dense and paged/sdpa ratios."""
    by_shape: dict[str, dict[str, dict]] = defaultdict(dict)
    for cell in cells:
        kind = "write_kv " if cell["path"].startswith("write") else ""
        by_shape[kind + cell["label"]][cell["path"]] = cell
    rows = []
    for label, paths in by_shape.items():
        row: dict = {"label": label}
        for path, cell in paths.items():
            row[f"{path}_us"] = cell.get("median_us")
            if "kv_gbps" in cell:
                row[f"{path}_kv_gbps"] = cell["kv_gbps"]
        row["paged_over_dense"] = _ratio(paths.get("paged"), paths.get("dense"))
        row["paged_over_sdpa"] = _ratio(paths.get("paged"), paths.get("sdpa"))
        row["write_over_functional"] = _ratio(paths.get("write"), paths.get("write_functional"))
        rows.append(row)
    return rows


def _fmt(value: float | None, spec: str) -> str:
    width = spec.split(".")[0]
    return format("-", f">{width}") if value is None else format(value, spec)


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of `summary_rows` (us, GB/s of K/V, ratios)."""
    header = (
        f"{'shape':<53} {'dense us':>10} {'gather us':>10} {'paged us':>10} {'sdpa us':>10} "
        f"{'paged GB/s':>10} {'sdpa GB/s':>10} {'p/dense':>8} {'p/sdpa':>8}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        if row.get("write_us") is not None or row.get("write_functional_us") is not None:
            lines.append(
                f"{row['label']:<53} {_fmt(row.get('write_us'), '.2f')} us; "
                f"copy-then-scatter {_fmt(row.get('write_functional_us'), '.1f')} us, "
                f"ratio {_fmt(row['write_over_functional'], '.4f')}"
            )
            continue
        lines.append(
            f"{row['label']:<53} {_fmt(row.get('dense_us'), '10.1f')} "
            f"{_fmt(row.get('gather_us'), '10.1f')} {_fmt(row.get('paged_us'), '10.1f')} "
            f"{_fmt(row.get('sdpa_us'), '10.1f')} {_fmt(row.get('paged_kv_gbps'), '10.1f')} "
            f"{_fmt(row.get('sdpa_kv_gbps'), '10.1f')} {_fmt(row['paged_over_dense'], '8.3f')} "
            f"{_fmt(row['paged_over_sdpa'], '8.3f')}"
        )
    return "\n".join(lines)
