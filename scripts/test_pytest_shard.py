"""The `--shard I/N` plugin: shards split the collected tests without overlap or loss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent


def _run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_shard", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env={"PYTHONPATH": str(SCRIPTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def _passed(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.split()[0] for line in result.stdout.splitlines() if " PASSED" in line]


@pytest.fixture
def seven_tests(tmp_path: Path) -> Path:
    body = "\n".join(f"def test_{i}():\n    pass\n" for i in range(7))
    (tmp_path / "test_many.py").write_text(body)
    return tmp_path


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shards_partition_the_tests(seven_tests: Path, count: int) -> None:
    everything = _passed(_run_pytest(seven_tests, "-v"))
    assert len(everything) == 7
    shards = [
        _passed(_run_pytest(seven_tests, "-v", f"--shard={i}/{count}")) for i in range(1, count + 1)
    ]
    assert sorted(sum(shards, [])) == sorted(everything)
    assert shards[0] == everything[::count]  # round robin in collected order


@pytest.mark.parametrize("text", ["0/2", "3/2", "1-2", "a/b", "1/2/3"])
def test_bad_shards_are_usage_errors(seven_tests: Path, text: str) -> None:
    result = _run_pytest(seven_tests, f"--shard={text}")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--shard" in result.stderr
