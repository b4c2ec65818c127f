"""pytest plugin: run one shard of the collected tests, `--shard I/N`.

Shard I of N keeps tests I, I + N, I + 2N, ... (1-based) of the tests left after the other
selections (`-k`, `-m`), in collected order, so neighbouring tests, which often cost alike, fall
into different shards. `scripts/gpu.sh` loads it (`TEST_SHARD`) to split the GPU suite over
device calls that cannot hold all of it:

    PYTHONPATH=scripts python -m pytest -p pytest_shard --shard 1/2
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        metavar="I/N",
        help="run only tests I, I+N, I+2N, ... (1-based) of the selected tests",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """(I, N) from "I/N"; a UsageError that names the expected form otherwise."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard expects I/N (two integers), got {text!r}") from None
    if not 1 <= index <= count:
        raise pytest.UsageError(f"--shard {text}: expected 1 <= I <= N")
    return index, count


def pytest_configure(config: pytest.Config) -> None:
    text = config.getoption("--shard")
    if text is not None:
        parse_shard(text)  # before collection, so a typo costs nothing


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    text = config.getoption("--shard")
    if text is None:
        return
    index, count = parse_shard(text)
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for position, item in enumerate(items):
        (kept if position % count == index - 1 else deselected).append(item)
    config.hook.pytest_deselected(items=deselected)
    items[:] = kept
