"""Fixtures of the pagepool tests."""

from __future__ import annotations

import mlx.core as mx
import pytest

from pagepool import KVStorage, PagePool


@pytest.fixture
def pool() -> PagePool:
    """A fixed pool of 8 pages of 4 tokens."""
    return PagePool(page_size=4, num_pages=8)


@pytest.fixture
def growable_pool() -> PagePool:
    """A growable pool starting at 2 pages of 3 tokens."""
    return PagePool(page_size=3, num_pages=2, growable=True)


@pytest.fixture
def storage(pool: PagePool) -> KVStorage:
    """Two-layer float32 storage over `pool`, poisoned with NaN."""
    return KVStorage(
        pool, num_layers=2, num_kv_heads=2, head_dim=3, dtype=mx.float32, fill_value=float("nan")
    )
