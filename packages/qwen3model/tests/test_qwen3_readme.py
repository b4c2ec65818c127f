"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_example_runs(capsys) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    exec(compile(example, str(README), "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("[") and printed.count("'") >= 4
