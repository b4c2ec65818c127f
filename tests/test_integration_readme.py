"""The root README's first command, run as a new user would: `uv run qwen3model serve-bench`.

The test runs the environment's `qwen3model` console script (what `uv run` resolves to, without
letting uv re-sync the environment), with the command's defaults. The README's second command
(`uv run pytest -q`) is the one CI itself runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    assert block is not None, "the root README lost its bash block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def console_script() -> list[str]:
    script = Path(sys.executable).parent / "qwen3model"
    if script.is_file():
        return [str(script)]
    found = shutil.which("qwen3model")
    return [found] if found else [sys.executable, "-m", "qwen3model"]


def test_readme_lists_serve_bench_then_pytest() -> None:
    assert readme_commands() == ["uv run qwen3model serve-bench", "uv run pytest -q"]


@pytest.mark.slow
def test_serve_bench_with_its_defaults() -> None:
    command = readme_commands()[0].split()
    assert command[:2] == ["uv", "run"]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}
    done = subprocess.run(
        console_script() + command[3:],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    table = done.stdout
    assert "synthetic:qwen3-" in table
    for row in ("prefill tok/s", "decode tok/s", "decode step ms median", "peak KV memory"):
        assert row in table
    copied = next(line for line in table.splitlines() if "K/V bytes copied" in line)
    cells = [cell.strip() for cell in copied.split("│")[2:-1]]
    assert len(cells) == 3 and cells[2] == "0 B" and cells[0] != "0 B" and cells[1] != "0 B"
    assert "bytes not copied vs dense" in table
