"""The README's API example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs():
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert example is not None
    exec(compile(example.group(1), str(README), "exec"), {})
