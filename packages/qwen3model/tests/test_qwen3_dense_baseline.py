"""DenseKVStore: rows identified by their first page, fresh caches at position 0, eviction."""

from __future__ import annotations

import mlx.core as mx
import pytest

from pagepool import BatchMetadata, PageCopy, PageList, PagePool
from pageruntime import KVStore
from qwen3model import DenseKVStore


def store_and_pool(num_pages: int = 8) -> tuple[DenseKVStore, PagePool]:
    pool = PagePool(4, num_pages)
    store = DenseKVStore(pool, num_layers=2, num_kv_heads=2, head_dim=8, dtype=mx.float32)
    return store, pool


def step(store: DenseKVStore, rows: list[PageList | None], num_tokens: int) -> None:
    for row in rows:
        if row is not None:
            row.append(num_tokens)
    store.begin_step(BatchMetadata.build(rows, query_len=num_tokens))


def test_caches_follow_requests_and_die_with_their_pages() -> None:
    store, pool = store_and_pool()
    a, b = PageList(pool), PageList(pool)
    step(store, [a], 6)
    step(store, [b], 3)
    step(store, [a, b], 1)
    assert store.num_requests == 2
    assert store.nbytes == 2 * 2 * 2 * (2 * 256 * 8 * 4)  # 2 requests x 2 layers x K,V
    a.release()
    step(store, [b], 1)
    assert store.num_requests == 1
    assert store.peak_nbytes == 2 * store.nbytes


def test_a_reused_page_evicts_the_stale_cache() -> None:
    store, pool = store_and_pool(num_pages=3)
    a = PageList(pool)
    step(store, [a], 4)  # page 0
    a_first = a.page_ids[0]
    a.release()
    b = PageList(pool)
    step(store, [b], 12)  # pages 1, 2, 0: a's first page is now b's third
    assert a_first in b.page_ids[1:]
    assert store.num_requests == 1


def test_position_zero_starts_a_fresh_cache() -> None:
    store, pool = store_and_pool(num_pages=2)
    a = PageList(pool)
    step(store, [a], 5)
    a_first = a.page_ids[0]
    a.release()
    b = PageList(pool)
    step(store, [b], 2)  # the pool hands b the page a started on
    step(store, [b], 1)  # continues b's 2 positions, not a's 5
    assert store.num_requests == 1
    assert b.page_ids[0] == a_first


def test_rows_the_baseline_cannot_follow_are_errors() -> None:
    store, pool = store_and_pool()
    a = PageList(pool)
    a.append(5)  # written without the store seeing it
    a.append(1)
    with pytest.raises(ValueError, match="continues at position 5"):
        store.begin_step(BatchMetadata.build([a], query_len=1))
    b = PageList(pool)
    step(store, [b], 4)
    fork = b.fork()
    b.append(1)
    fork.append(1)
    with pytest.raises(ValueError, match="shares first page"):
        store.begin_step(BatchMetadata.build([b, fork], query_len=1))


def test_is_an_engine_kv_store_that_refuses_page_copies() -> None:
    store, pool = store_and_pool()
    assert isinstance(store, KVStore) and store.pool is pool
    store.copy_pages([])  # nothing to do
    with pytest.raises(ValueError, match="keeps no pages to copy, got 1 copy-on-write"):
        store.copy_pages([PageCopy(src=0, dst=1)])
    row = PageList(pool)
    step(store, [row], 5)
    assert len(store.step_arrays()) == 2 * 2  # one cache: K and V of two layers
