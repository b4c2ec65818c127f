"""Read an Nsight Compute SASS listing (`scripts/gpu.sh prefill-profile` writes
`<case>-sass.csv.gz`: `ncu -i <report> --page source --csv --print-source sass`).

Three views, each over the instruction indices of the listing (0 = its first instruction):

    ncu_sass.py list  LISTING [--min-samples N]      instructions with their warp-stall samples
    ncu_sass.py sum   LISTING RANGE [RANGE ...]      samples and stall reasons of index ranges
    ncu_sass.py count LISTING [--top N]              samples by execution count

A RANGE is `a-b` (inclusive) or one index. Instructions executed the same number of times run
at the same place in the kernel's loops (once per work item and warp, once per tile and warp),
so `count` splits the samples by loop level.
"""

from __future__ import annotations

import argparse
import csv
import gzip
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_SAMPLES = "Warp Stall Sampling (All Samples)"
_EXECUTED = "Instructions Executed"


@dataclass(frozen=True)
class Instruction:
    index: int
    sass: str
    samples: int
    executed: int
    stalls: dict[str, int]  # reason (without the `stall_` prefix) -> samples


def read_listing(path: Path) -> list[Instruction]:
    """The instructions of a listing; row 0 names the kernel, row 1 is the header."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or _SAMPLES not in rows[1]:
        raise ValueError(f"{path}: not an ncu SASS listing (no {_SAMPLES!r} column in row 2)")
    header = rows[1]
    column = {name: i for i, name in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def number(row: list[str], name: str) -> int:
        text = row[column[name]].replace(",", "")
        return int(text) if text.strip() else 0

    listing = []
    for i, row in enumerate(rows[2:]):
        stalls = {r.removeprefix("stall_"): number(row, r) for r in reasons}
        listing.append(
            Instruction(
                index=i,
                sass=row[column["Source"]].strip(),
                samples=number(row, _SAMPLES),
                executed=number(row, _EXECUTED),
                stalls={reason: n for reason, n in stalls.items() if n},
            )
        )
    return listing


def parse_range(text: str) -> range:
    """`a-b` (inclusive) or `a`."""
    first, _, last = text.partition("-")
    start = int(first)
    stop = int(last) if last else start
    if stop < start:
        raise argparse.ArgumentTypeError(f"range {text!r}: end before start")
    return range(start, stop + 1)


def stall_summary(stalls: dict[str, int], top: int) -> str:
    ranked = sorted(stalls.items(), key=lambda item: -item[1])[:top]
    return " ".join(f"{reason}={samples}" for reason, samples in ranked)


def list_view(listing: list[Instruction], min_samples: int) -> list[str]:
    return [
        f"{ins.index:6d} {ins.samples:7d} {ins.executed:10d}  {ins.sass[:72]:72s} "
        f"{stall_summary(ins.stalls, 3)}"
        for ins in listing
        if ins.samples >= min_samples
    ]


def sum_view(listing: list[Instruction], ranges: list[range]) -> list[str]:
    total = sum(ins.samples for ins in listing)
    lines = []
    for r in ranges:
        chosen = [ins for ins in listing if ins.index in r]
        samples = sum(ins.samples for ins in chosen)
        stalls: Counter[str] = Counter()
        for ins in chosen:
            stalls.update(ins.stalls)
        share = samples / total if total else 0.0
        lines.append(
            f"{r.start}-{r.stop - 1}: {samples} samples ({share:.1%} of {total}), "
            f"{sum(ins.executed for ins in chosen)} warp-instructions; {stall_summary(stalls, 5)}"
        )
    return lines


def count_view(listing: list[Instruction], top: int) -> list[str]:
    by_count: Counter[int] = Counter()
    instructions: Counter[int] = Counter()
    for ins in listing:
        by_count[ins.executed] += ins.samples
        instructions[ins.executed] += 1
    return [
        f"executed {count:10d} times: {samples:7d} samples in {instructions[count]} instructions"
        for count, samples in by_count.most_common(top)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    views = parser.add_subparsers(dest="view", required=True)
    list_parser = views.add_parser("list", help="instructions with their samples")
    list_parser.add_argument("listing", type=Path)
    list_parser.add_argument("--min-samples", type=int, default=1)
    sum_parser = views.add_parser("sum", help="samples of index ranges")
    sum_parser.add_argument("listing", type=Path)
    sum_parser.add_argument("ranges", type=parse_range, nargs="+")
    count_parser = views.add_parser("count", help="samples by execution count")
    count_parser.add_argument("listing", type=Path)
    count_parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)

    listing = read_listing(args.listing)
    if args.view == "list":
        lines = list_view(listing, args.min_samples)
    elif args.view == "sum":
        lines = sum_view(listing, args.ranges)
    else:
        lines = count_view(listing, args.top)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
