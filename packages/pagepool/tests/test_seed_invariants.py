"""The chapter's "What Must Hold" invariants, one test each, on storage poisoned with NaN."""

from __future__ import annotations

import math
from collections import Counter

import mlx.core as mx
import pytest
from pagepool_test_helpers import read_tokens, write_tokens

from pagepool import BatchMetadata, KVStorage, PageAlreadyFree, PageList, PagePool


def _storage(pool: PagePool) -> KVStorage:
    return KVStorage(
        pool, num_layers=2, num_kv_heads=2, head_dim=2, dtype=mx.float32, fill_value=math.nan
    )


def _interleaved_requests(
    pool: PagePool, storage: KVStorage
) -> tuple[list[PageList], list[list[int]]]:
    """Three requests whose prefill chunks and decodes interleave, so their pages interleave."""
    lists = [PageList(pool) for _ in range(3)]
    expected: list[list[int]] = [[], [], []]
    schedule = [(0, 5), (1, 3), (2, 7), (0, 1), (1, 6), (2, 1), (0, 1), (1, 1), (0, 4), (2, 1)]
    next_token = 100
    for index, num_tokens in schedule:
        tokens = list(range(next_token, next_token + num_tokens))
        next_token += num_tokens
        write_tokens(storage, lists[index].append(num_tokens).slots, tokens)
        expected[index] += tokens
    return lists, expected


def test_context_len_equals_written_positions() -> None:
    pool = PagePool(page_size=4, num_pages=16)
    storage = _storage(pool)
    lists, expected = _interleaved_requests(pool, storage)
    metadata = BatchMetadata.build(lists, query_len=1)
    for b, pages in enumerate(lists):
        assert pages.context_len == len(expected[b]) == metadata.context_lens_host[b]
        # Every position below context_len was written; every slot past it is still poison.
        capacity = len(pages.page_ids) * pool.page_size
        tail = storage.keys[0][pages.page_ids[-1]]
        unwritten = capacity - pages.context_len
        assert mx.isnan(tail[:, pool.page_size - unwritten :]).all().item()
        assert not mx.isnan(tail[:, : pool.page_size - unwritten]).any().item()
    assert metadata.context_lens.tolist() == [len(expected[b]) for b in range(3)]


def test_block_table_reconstructs_logical_order() -> None:
    pool = PagePool(page_size=3, num_pages=16)
    storage = _storage(pool)
    lists, expected = _interleaved_requests(pool, storage)
    metadata = BatchMetadata.build([lists[0], None, lists[1], lists[2]], query_len=1, max_pages=6)
    table = metadata.block_table.tolist()  # the device array, not only the host copy
    for b, index in ((0, 0), (2, 1), (3, 2)):
        row = [page_id for page_id in table[b] if page_id >= 0]
        assert read_tokens(storage, row, metadata.context_lens_host[b]) == expected[index]
    # The fixture is not trivial: some request's pages are not one contiguous run.
    assert any(
        list(pages.page_ids)
        != list(range(pages.page_ids[0], pages.page_ids[0] + len(pages.page_ids)))
        for pages in lists
    )


def test_pages_are_owned_by_one_live_list_unless_shared() -> None:
    pool = PagePool(page_size=2, num_pages=32)
    lists = [PageList(pool) for _ in range(4)]
    for step in range(10):
        lists[step % 4].append(step % 3 + 1)
    forked = lists[0].fork()
    forked.append(1)
    holders = Counter(page_id for pages in lists + [forked] for page_id in pages.page_ids)
    for page_id, count in holders.items():
        assert pool.refcount(page_id) == count
    shared = {page_id for page_id, count in holders.items() if count > 1}
    assert shared and shared <= set(lists[0].page_ids)
    for a in lists[1:]:
        for b in lists:
            if a is not b:
                assert not set(a.page_ids) & set(b.page_ids)


def test_release_returns_every_page_exactly_once() -> None:
    pool = PagePool(page_size=4, num_pages=12)
    parent = PageList(pool)
    parent.append(10)
    child = parent.fork()
    child.append(3)
    owned = set(parent.page_ids) | set(child.page_ids)
    for pages in (parent, child, parent):
        pages.release()
    assert pool.num_live == 0 and pool.num_free == pool.capacity
    free_ids = list(pool._free_ids)
    assert sorted(free_ids) == list(range(12)) and owned <= set(free_ids)
    with pytest.raises(PageAlreadyFree):
        pool.free([next(iter(owned))])


def test_decode_allocates_only_when_the_tail_overflows() -> None:
    pool = PagePool(page_size=4, num_pages=2, growable=True)
    pages = PageList(pool)
    pages.append(3)
    for _ in range(5):  # tokens 3..7 fill the two pages exactly
        pages.append(1)
    assert len(pages.page_ids) == 2 and pool.metrics().num_growths == 0
    assert pool.metrics().tail_waste_slots == 0
    pages.append(1)  # token 8 overflows: now, and only now, a page (and a growth)
    assert len(pages.page_ids) == 3 and pool.metrics().num_growths == 1
