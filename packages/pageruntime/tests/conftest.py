"""Fixtures of the pageruntime tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import structlog

from pageruntime import Engine
from pageruntime.testing import ContextHashModel


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Undo any `configure_logging` a test made, so `capture_logs` sees every event."""
    yield
    structlog.reset_defaults()


def _engine_factory(overlap_decode: bool) -> Callable[..., Engine]:
    def make(model: object | None = None, **kwargs: object) -> Engine:
        options: dict[str, object] = dict(num_pages=32, page_size=4, prefill_step=8)
        if kwargs.get("admission", "reserve") == "reserve":
            options["overlap_decode"] = overlap_decode
        options.update(kwargs)
        return Engine(ContextHashModel() if model is None else model, **options)

    return make


@pytest.fixture(params=[False, True], ids=["sync", "overlap"])
def make_engine(request: pytest.FixtureRequest) -> Callable[..., Engine]:
    """`make_engine(model=None, **engine_kwargs)`: an engine on a `ContextHashModel` by default
    (max_seq_len 256), with small pages (4 tokens) and a small prefill budget (8 tokens).

    Every test that uses it runs twice: with synchronous steps, and with `overlap_decode` (the
    next decode step launched before this one is collected) wherever the admission policy
    allows it (optimistic admission runs synchronous steps under both ids); both must behave
    the same."""
    return _engine_factory(request.param)


@pytest.fixture
def make_sync_engine() -> Callable[..., Engine]:
    """`make_engine` with synchronous steps only, for tests of what one step's calls are."""
    return _engine_factory(False)
