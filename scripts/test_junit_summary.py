"""`junit_summary.py` on reports that pytest itself writes: only an all-passed run exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent

TESTS = {
    "passing": "def test_a():\n    pass\n\ndef test_b():\n    pass\n",
    "failing": "def test_a():\n    pass\n\ndef test_b():\n    assert False\n",
    "erroring": "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n"
    "def test_a(broken):\n    pass\n",
    "skipping": "import pytest\n\ndef test_a():\n    pass\n\n"
    "@pytest.mark.skip(reason='no GPU')\ndef test_b():\n    pass\n",
    "empty": "def helper():\n    pass\n",
}


def _report(tmp_path: Path, source: str) -> Path:
    (tmp_path / "test_case.py").write_text(source)
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=tmp_path,
        capture_output=True,
    )
    return report


def _summary(report: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "junit_summary.py"), str(report)],
        capture_output=True,
        text=True,
    )


def test_all_passed_exits_zero_with_the_totals(tmp_path: Path) -> None:
    result = _summary(_report(tmp_path, TESTS["passing"]))
    assert result.returncode == 0
    assert result.stdout.strip() == "2 tests, 0 failures, 0 errors, 0 skipped"


@pytest.mark.parametrize(
    ("case", "line"),
    [
        ("failing", "2 tests, 1 failures, 0 errors, 0 skipped"),
        ("erroring", "1 tests, 0 failures, 1 errors, 0 skipped"),
        ("skipping", "2 tests, 0 failures, 0 errors, 1 skipped"),
        ("empty", "0 tests, 0 failures, 0 errors, 0 skipped"),
    ],
)
def test_anything_but_all_passed_exits_one(tmp_path: Path, case: str, line: str) -> None:
    result = _summary(_report(tmp_path, TESTS[case]))
    assert result.returncode == 1
    assert result.stdout.strip() == line


def test_a_missing_report_exits_one_and_says_so(tmp_path: Path) -> None:
    result = _summary(tmp_path / "absent.xml")
    assert result.returncode == 1
    assert "no readable JUnit report" in result.stderr
