"""Provenance of results files: the commit from git (clean or dirty), else `$COMMIT`."""

from __future__ import annotations

import stat
from pathlib import Path

import mlx.core as mx
import pytest

from qwen3model import collect_provenance

SHA = "0123456789abcdef0123456789abcdef01234567"


def _fake_git(bin_dir: Path, status_output: str) -> None:
    """A `git` on PATH that answers `rev-parse HEAD` with SHA and `status` with status_output."""
    script = bin_dir / "git"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *rev-parse*) echo {SHA} ;; *status*) printf "{status_output}" ;; '
        "*) exit 1 ;; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(("status_output", "dirty"), [("", False), (" M model.py\\n", True)])
def test_commit_comes_from_git_with_its_dirty_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status_output: str, dirty: bool
) -> None:
    _fake_git(tmp_path, status_output)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("COMMIT", "not-this-one")
    commit = collect_provenance("cpu")["commit"]
    assert commit == {"sha": SHA, "source": "git rev-parse HEAD", "dirty": dirty}


def test_without_git_the_commit_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git, no nvidia-smi
    monkeypatch.setenv("COMMIT", "abc1234")
    provenance = collect_provenance("gpu")
    assert provenance["commit"] == {"sha": "abc1234", "source": "COMMIT environment variable"}
    assert provenance["gpu"] is None and provenance["device"] == "gpu"
    assert provenance["mlx_version"] == mx.__version__ and provenance["command"]
