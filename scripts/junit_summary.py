"""Totals of a pytest JUnit report, and an exit status that fails unless every test passed.

`scripts/gpu.sh`'s test stage ends with it, so that the job's status says whether the GPU tests
passed (pytest's own status is lost in the pipe, and passes skipped tests). A report with a
failure, an error or a skipped test (on the GPU, a skip means the test did not run), with no
test at all, or no report (a timeout) exits 1:

    python3 scripts/junit_summary.py out/suite/gpu-tests.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

COUNTS = ("tests", "failures", "errors", "skipped")


def totals(report: Path) -> dict[str, int]:
    """Each count of COUNTS summed over the report's test suites."""
    root = ET.parse(report).getroot()
    sums = dict.fromkeys(COUNTS, 0)
    for suite in root.iter("testsuite"):
        for name in COUNTS:
            sums[name] += int(suite.get(name, 0))
    return sums


def all_passed(sums: dict[str, int]) -> bool:
    """At least one test, and none failed, errored or skipped."""
    return sums["tests"] > 0 and sums["failures"] + sums["errors"] + sums["skipped"] == 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: junit_summary.py REPORT.xml", file=sys.stderr)
        return 2
    try:
        sums = totals(Path(argv[0]))
    except (OSError, ET.ParseError) as error:
        print(f"{argv[0]}: no readable JUnit report ({error})", file=sys.stderr)
        return 1
    print(", ".join(f"{value} {name}" for name, value in sums.items()))
    return 0 if all_passed(sums) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
