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


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    """`make_engine(model=None, **engine_kwargs)`: an engine on a `ContextHashModel` by default
    (max_seq_len 256), with small pages (4 tokens) and a small prefill budget (8 tokens)."""

    def make(model: object | None = None, **kwargs: object) -> Engine:
        options: dict[str, object] = dict(num_pages=32, page_size=4, prefill_step=8)
        options.update(kwargs)
        return Engine(ContextHashModel() if model is None else model, **options)

    return make
