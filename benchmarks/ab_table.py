"""The paired table of a kernel A/B from scripts/gpu-ab.sh's attention JSON (development machine).

gpu-ab.sh runs every variant once per round, in alternating order, and the default benchmark
writes `prefill-<variant>-<round>.json` (attention.py's schema). This prints, per shape, each
variant's paged time in every round with MLX SDPA's time from the same processes, the ratio
paged / SDPA, and each variant's change against the baseline variant in the same round (the
pairing that makes two processes on one machine comparable):

    python benchmarks/ab_table.py benchmarks/results/h200/session17/packed-p-82acbc5
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

RESULT_NAME = re.compile(r"^(?P<prefix>[a-z]+)-(?P<variant>.+)-(?P<round>\d+)\.json$")


@dataclass(frozen=True)
class Cell:
    """One shape of one variant in one round: paged and MLX SDPA microseconds per call."""

    paged_us: float
    sdpa_us: float | None


def variant_order(folder: Path, found: set[str]) -> list[str]:
    """The variants in gpu-ab.sh's order (its variants.txt), else sorted; the first is the
    baseline unless the command line names another."""
    listing = folder / "variants.txt"
    if listing.exists():
        names = [line.split()[0] for line in listing.read_text().splitlines() if line.strip()]
        return [n for n in names if n in found] + sorted(found - set(names))
    return sorted(found)


def load_cells(folder: Path, prefix: str) -> dict[str, dict[int, dict[str, Cell]]]:
    """variant -> round -> shape label -> Cell, from every `<prefix>-<variant>-<round>.json`."""
    cells: dict[str, dict[int, dict[str, Cell]]] = defaultdict(dict)
    for path in sorted(folder.glob(f"{prefix}-*.json")):
        match = RESULT_NAME.match(path.name)
        if match is None or match["prefix"] != prefix:
            continue
        data = json.loads(path.read_text())
        if data.get("kind") != "attention":
            raise ValueError(f"{path}: kind {data.get('kind')!r}, expected 'attention'")
        cells[match["variant"]][int(match["round"])] = {
            row["label"]: Cell(row["paged_us"], row.get("sdpa_us"))
            for row in data["summary"]
            if row.get("paged_us") is not None
        }
    if not cells:
        raise ValueError(f"no {prefix}-<variant>-<round>.json under {folder}")
    return cells


def span(values: list[float], fmt: str = "{:.3f}", between: str = "-") -> str:
    return fmt.format(min(values)) + between + fmt.format(max(values)) if values else "-"


def table(cells: dict[str, dict[int, dict[str, Cell]]], order: list[str], baseline: str) -> str:
    """Markdown: one row per (shape, variant), rounds in columns."""
    rounds = sorted({r for by_round in cells.values() for r in by_round})
    labels = sorted(
        {label for by_round in cells.values() for shapes in by_round.values() for label in shapes},
        key=lambda label: [int(n) if n.isdigit() else n for n in re.split(r"(\d+)", label)],
    )
    head = ["shape", "variant"] + [f"round {r}: paged / SDPA us" for r in rounds]
    head += ["paged / SDPA", f"vs {baseline}, paired", "mean change"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        for variant in order:
            row = [label, variant]
            ratios: list[float] = []
            changes: list[float] = []
            for r in rounds:
                cell = cells[variant].get(r, {}).get(label)
                if cell is None:
                    row.append("-")
                    continue
                sdpa = f"{cell.sdpa_us:.1f}" if cell.sdpa_us is not None else "-"
                row.append(f"{cell.paged_us:.1f} / {sdpa}")
                if cell.sdpa_us:
                    ratios.append(cell.paged_us / cell.sdpa_us)
                base = cells[baseline].get(r, {}).get(label)
                if variant != baseline and base is not None:
                    changes.append(cell.paged_us / base.paged_us - 1.0)
            row.append(span(ratios))
            if variant == baseline or not changes:
                row += ["-", "-"]
            else:
                row.append(span([100 * c for c in changes], "{:+.1f}", " to ") + " %")
                row.append(f"{100 * statistics.fmean(changes):+.1f} %")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="gpu-ab.sh's $OUT (unpacked)")
    parser.add_argument("--prefix", default="prefill", help="the JSON files' name prefix")
    parser.add_argument("--baseline", help="variant the others are compared with (default: first)")
    args = parser.parse_args(argv)
    try:
        cells = load_cells(args.folder, args.prefix)
    except ValueError as error:
        print(f"ab_table: {error}", file=sys.stderr)
        return 2
    order = variant_order(args.folder, set(cells))
    baseline = args.baseline or order[0]
    if baseline not in cells:
        print(f"ab_table: no variant {baseline!r}; found {', '.join(order)}", file=sys.stderr)
        return 2
    print(table(cells, order, baseline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
