"""The `--shard I/N` plugin: shards split the selected tests without overlap or loss."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent


@dataclass
class Run:
    returncode: int
    passed: list[str]  # test names, in the order run
    deselected: int
    stderr: str


def _run_pytest(folder: Path, *args: str) -> Run:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "pytest_shard",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=folder,
        env={"PYTHONPATH": str(SCRIPTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    passed = re.findall(r"::(\w+) PASSED", result.stdout)
    deselected = re.search(r"(\d+) deselected", result.stdout)
    return Run(result.returncode, passed, int(deselected[1]) if deselected else 0, result.stderr)


@pytest.fixture
def eight_tests(tmp_path: Path) -> Path:
    names = [f"test_{kind}_{i}" for i in range(4) for kind in ("apple", "pear")]
    (tmp_path / "test_fruit.py").write_text("".join(f"def {n}():\n    pass\n" for n in names))
    return tmp_path


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shards_partition_the_tests(eight_tests: Path, count: int) -> None:
    everything = _run_pytest(eight_tests).passed
    assert len(everything) == 8
    shards = [_run_pytest(eight_tests, f"--shard={i}/{count}") for i in range(1, count + 1)]
    assert sorted(sum((shard.passed for shard in shards), [])) == sorted(everything)
    assert shards[0].passed == everything[::count]  # round robin in collected order
    assert [shard.deselected for shard in shards] == [8 - len(shard.passed) for shard in shards]


def test_shards_split_what_k_selected(eight_tests: Path) -> None:
    first, second = (_run_pytest(eight_tests, "-k", "pear", f"--shard={i}/2") for i in (1, 2))
    assert first.passed == ["test_pear_0", "test_pear_2"]
    assert second.passed == ["test_pear_1", "test_pear_3"]
    assert first.deselected == second.deselected == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0/2", "1 <= I <= N"),
        ("3/2", "1 <= I <= N"),
        ("1-2", "expects I/N"),
        ("a/b", "expects I/N"),
    ],
)
def test_bad_shards_are_usage_errors(eight_tests: Path, text: str, message: str) -> None:
    run = _run_pytest(eight_tests, f"--shard={text}")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert message in run.stderr
