"""The README's example, run as a fresh program, prints exactly what the README shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_example_runs_alone_and_prints_its_documented_output() -> None:
    # A fresh interpreter: nothing configured structlog before the example did.
    [code] = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    [expected] = re.findall(r"```text\n(.*?)```", README, re.DOTALL)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == (expected, "")
