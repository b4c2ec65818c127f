"""The README's example runs and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_prints_its_documented_output() -> None:
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    output = re.search(r"```text\n(.*?)```", text, re.DOTALL)
    assert code and output, "README needs a ```python example followed by its ```text output"
    assert 5 <= len(code.group(1).splitlines()) <= 13
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.group(1), str(README), "exec"), {})
    assert printed.getvalue() == output.group(1)
