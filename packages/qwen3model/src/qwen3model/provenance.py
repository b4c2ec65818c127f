"""Where a benchmark result came from: host, processor, GPU, MLX version, commit, command line.

Every results JSON (`qwen3model serve-bench --json-output` and the tools in `benchmarks/`)
carries this record, so a number can be traced back to the machine and the code that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

__all__ = ["collect_provenance"]

# The commit is read where this package's source lives: the repository in an editable install.
# Elsewhere (an installed wheel, a copy without .git) `$COMMIT` names it.
_SOURCE_DIR = Path(__file__).resolve().parent


def _run(args: list[str]) -> str | None:
    """Returns the stripped stdout of a command, or None if it is missing or fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> dict[str, str] | None:
    query = "name,driver_version,memory.total"
    out = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"])
    if out is None:
        return None
    name, driver, memory = (f.strip() for f in out.splitlines()[0].split(",")[:3])
    return {"name": name, "driver": driver, "memory": memory, "count": str(len(out.splitlines()))}


def _commit() -> dict[str, str | bool | None]:
    sha = _run(["git", "-C", str(_SOURCE_DIR), "rev-parse", "HEAD"])
    if sha is None:
        return {"sha": os.environ.get("COMMIT"), "source": "COMMIT environment variable"}
    dirty = _run(["git", "-C", str(_SOURCE_DIR), "status", "--porcelain", "--untracked-files=no"])
    return {"sha": sha, "source": "git rev-parse HEAD", "dirty": dirty is not None}


def _command_line() -> str:
    """The command that started this process, quoted so it can be pasted into a shell."""
    return shlex.join([Path(sys.executable).name, *sys.argv])


def collect_provenance(device: str) -> dict[str, object]:
    """Describes the machine, the software and the command behind a results file.

    Args:
        device: The MLX device the measurements ran on ("cpu" or "gpu").

    Returns:
        A JSON-serialisable dict: host, platform, python, cpu, cpu_count, gpu (None without
        nvidia-smi), mlx_version, cuda_available, device, commit (sha from `git rev-parse HEAD`
        in this package's repository, else `$COMMIT`, else None), command, utc_time.
    """
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpu": _gpu(),
        "mlx_version": mx.__version__,
        "cuda_available": bool(mx.cuda.is_available()),
        "device": device,
        "commit": _commit(),
        "command": _command_line(),
        "utc_time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
