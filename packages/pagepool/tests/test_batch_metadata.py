"""BatchMetadata: fields, padding, widths, and the rejection table of both factories."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest
from pagepool_test_helpers import snapshot

from pagepool import (
    BatchMetadata,
    InvalidArgument,
    InvalidMetadata,
    PageList,
    PagePool,
    packed_int32,
)


def _list_with(pool: PagePool, num_tokens: int) -> PageList:
    pages = PageList(pool)
    pages.append(num_tokens)
    return pages


def test_seed_example_maps_logical_positions_to_pages() -> None:
    # The chapter's example: page_ids [12, 5, 3], context_len 10, page_size 4.
    metadata = BatchMetadata.from_host(
        [[12, 5, 3]], [10], query_len=3, page_size=4, num_pages=16, max_pages=4
    )
    assert metadata.block_table.tolist() == [[12, 5, 3, -1]]
    assert metadata.context_lens.tolist() == [10]
    assert metadata.positions.tolist() == [7, 8, 9]
    assert metadata.slot_mapping.tolist() == [5 * 4 + 3, 3 * 4 + 0, 3 * 4 + 1]
    assert (metadata.batch_size, metadata.max_pages, metadata.num_pages) == (1, 4, 16)


def test_build_fields_shapes_dtypes_and_padding_rows(pool: PagePool) -> None:
    a, b = _list_with(pool, 9), _list_with(pool, 2)
    metadata = BatchMetadata.build([a, None, b], query_len=2)
    B, L = 3, 2
    assert metadata.block_table.shape == (B, 3) and metadata.context_lens.shape == (B,)
    assert metadata.slot_mapping.shape == (B * L,) and metadata.positions.shape == (B * L,)
    for array in (metadata.block_table, metadata.context_lens, metadata.slot_mapping,
                  metadata.positions):  # fmt: skip
        assert array.dtype == mx.int32
    assert metadata.block_table_host == (a.page_ids, (-1, -1, -1), b.page_ids + (-1, -1))
    assert metadata.context_lens_host == (9, 0, 2)
    assert metadata.slot_mapping.tolist() == [*a.slots(7, 9), -1, -1, *b.slots(0, 2)]
    assert metadata.slot_mapping_host == tuple(metadata.slot_mapping.tolist())
    assert metadata.positions.tolist() == [7, 8, 0, 0, 0, 1]
    assert metadata.block_table.tolist() == [list(row) for row in metadata.block_table_host]
    assert (metadata.query_len, metadata.page_size, metadata.num_pages) == (2, 4, 8)


def test_metadata_is_frozen_and_compared_by_identity(pool: PagePool) -> None:
    rows = [_list_with(pool, 3)]
    metadata = BatchMetadata.build(rows, query_len=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        metadata.query_len = 2  # type: ignore[misc]
    # eq=False: comparing never touches the arrays (which would raise), it is identity.
    assert metadata == metadata and metadata != BatchMetadata.build(rows, query_len=1)


def test_bucketed_width_pads_and_narrow_width_is_rejected(pool: PagePool) -> None:
    rows = [_list_with(pool, 5), _list_with(pool, 1)]
    wide = BatchMetadata.build(rows, query_len=1, max_pages=6)
    assert wide.max_pages == 6 and wide.block_table.shape == (2, 6)
    assert wide.block_table_host == (rows[0].page_ids + (-1,) * 4, rows[1].page_ids + (-1,) * 5)
    with pytest.raises(InvalidMetadata, match="row 0 has 2 pages but max_pages=1"):
        BatchMetadata.build(rows, query_len=1, max_pages=1)
    with pytest.raises(InvalidArgument, match="max_pages must be an int >= 1"):
        BatchMetadata.build(rows, query_len=1, max_pages=0)


def test_forked_rows_may_share_pages(pool: PagePool) -> None:
    parent = _list_with(pool, 5)
    child = parent.fork()
    parent.append(1)
    child.append(1)  # copy-on-write: the new tokens land in different pages
    metadata = BatchMetadata.build([parent, child], query_len=1)
    assert metadata.block_table_host[0][0] == metadata.block_table_host[1][0]
    assert metadata.slot_mapping_host[0] != metadata.slot_mapping_host[1]


def test_slots_cross_check_accepts_the_append_results(pool: PagePool) -> None:
    a, b = PageList(pool), PageList(pool)
    slots_a, slots_b = a.append(3).slots, b.append(3).slots
    metadata = BatchMetadata.build([a, None, b], [slots_a, (), slots_b], query_len=3)
    assert metadata.slot_mapping_host == (*slots_a, -1, -1, -1, *slots_b)


def test_build_changes_nothing_in_the_pool(pool: PagePool) -> None:
    rows = [_list_with(pool, 7), None]
    before = snapshot(pool, rows[0])
    BatchMetadata.build(rows, query_len=7)
    assert snapshot(pool, rows[0]) == before


def _released(pool: PagePool) -> PageList:
    pages = _list_with(pool, 3)
    pages.release()
    return pages


def _twice(pool: PagePool) -> list[PageList]:
    pages = _list_with(pool, 3)
    return [pages, pages]


def _forked_after_append(pool: PagePool) -> list[PageList]:
    parent = _list_with(pool, 3)
    return [parent, parent.fork()]  # both rows would write token 2 into the same slot


@pytest.mark.parametrize(
    ("make_rows", "kwargs", "match"),
    [
        (lambda pool: [], {}, "rows must be a non-empty sequence"),
        (lambda pool: [None, None], {}, "at least one real"),
        (lambda pool: [_released(pool)], {}, r"rows\[0\] was released"),
        (_twice, {}, r"rows\[1\] is a PageList already used"),
        (lambda pool: [_list_with(pool, 2), _list_with(PagePool(4, 2), 2)], {},
         r"rows\[1\] comes from another pool"),
        (lambda pool: [_list_with(pool, 2)], {"query_len": 3},
         r"context_lens\[0\]=2 is shorter than query_len=3"),
        (lambda pool: [None, PageList(pool)], {}, r"context_lens\[1\]=0 is shorter"),
        (lambda pool: [3], {}, r"rows\[0\] must be a PageList or None"),
        (_forked_after_append, {}, "is written by two new tokens"),
        (lambda pool: [_list_with(pool, 2)], {"slots": [[99]]},
         r"slots\[0\]=\[99\] differ from the page list's last 1 slots \[1\]"),
        (lambda pool: [_list_with(pool, 2)], {"slots": [[1], []]}, "slots has 2 rows"),
    ],
    ids=["empty", "all-padding", "released", "same-list-twice", "two-pools", "short-context",
         "empty-page-list", "not-a-page-list", "duplicate-slot", "slot-mismatch", "slot-rows"],
)  # fmt: skip
def test_build_rejects(pool: PagePool, make_rows, kwargs: dict, match: str) -> None:
    rows = make_rows(pool)
    before = snapshot(pool)
    with pytest.raises(InvalidMetadata, match=match):
        BatchMetadata.build(rows, **{"query_len": 1, **kwargs})
    assert snapshot(pool) == before


def test_both_factories_reject_a_zero_query_len(pool: PagePool) -> None:
    with pytest.raises(InvalidArgument, match="query_len must be an int >= 1, got 0"):
        BatchMetadata.build([_list_with(pool, 2)], query_len=0)
    with pytest.raises(InvalidArgument, match="query_len must be an int >= 1, got 0"):
        BatchMetadata.from_host([[0]], [2], query_len=0, page_size=4, num_pages=8)


def test_rows_may_be_any_sequence(pool: PagePool) -> None:
    rows = [_list_with(pool, 3), None]
    from_tuple = BatchMetadata.build(tuple(rows), query_len=1)
    assert from_tuple.block_table_host == BatchMetadata.build(rows, query_len=1).block_table_host
    with pytest.raises(InvalidMetadata, match="rows must be a non-empty sequence"):
        BatchMetadata.build(iter(rows), query_len=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("block_table", "context_lens", "kwargs", "match"),
    [
        ([[0, 9]], [5], {}, r"block_table\[0, 1\]=9 is outside storage \[0, 8\)"),
        ([[0, 1], [1, 2]], [8, 5], {}, "page 1 appears 2 times in the batch but is not shared"),
        ([[0, 0]], [5], {}, r"block_table\[0\] holds page 0 twice"),
        ([[0, 1]], [9], {}, r"context_lens\[0\]=9 needs 3 page\(s\) of 4, but the row has 2"),
        ([[0, 1, 2]], [5], {}, r"context_lens\[0\]=5 needs 2 page\(s\) of 4, but the row has 3"),
        ([[0, -1, 2]], [9], {}, "-1 padding may only trail the row"),
        ([[0, 1]], [5, 3], {}, "block_table has 1 rows but context_lens has 2"),
        ([], [], {}, "at least one row"),
        ([[-1, -1], [-1]], [0, 0], {}, "at least one real row"),
        ([[1, 2], [3]], [5, 0], {}, r"context_lens\[1\]=0 needs 0 page\(s\) of 4"),
        ([[1], [2]], [2, 3], {"query_len": 3}, r"context_lens\[0\]=2 is shorter"),
        ([[1, 2]], [8], {"max_pages": 1}, "row 0 has 2 pages but max_pages=1"),
    ],
    ids=["page-out-of-range", "aliased-live-page", "page-twice-in-row", "context-not-covered",
         "extra-page", "padding-in-middle", "row-count-mismatch", "empty", "all-padding",
         "padding-row-with-page",
         "short-context", "too-narrow"],
)  # fmt: skip
def test_from_host_rejects(block_table, context_lens, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidMetadata, match=match):
        BatchMetadata.from_host(
            block_table, context_lens, **{"query_len": 1, "page_size": 4, "num_pages": 8, **kwargs}
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"page_size": 0}, "page_size must be an int >= 1"),
        ({"num_pages": 0}, "num_pages must be an int >= 1"),
        ({"context_lens": [-3]}, r"context_lens\[0\] must be an int >= 0, got -3"),
        ({"block_table": [[-2]]}, r"block_table\[0\] must be an int >= -1, got -2"),
    ],
    ids=["page-size", "num-pages", "negative-context", "bad-sentinel"],
)
def test_from_host_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    arguments = {"block_table": [[0]], "context_lens": [3], "query_len": 1, "page_size": 4,
                 "num_pages": 8, **kwargs}  # fmt: skip
    with pytest.raises(InvalidArgument, match=match):
        BatchMetadata.from_host(**arguments)


def test_from_host_accepts_declared_shared_pages() -> None:
    metadata = BatchMetadata.from_host(
        [[0, 1], [0, 2, -1]], [6, 7], query_len=1, page_size=4, num_pages=8, shared_page_ids={0}
    )
    assert metadata.block_table_host == ((0, 1), (0, 2))
    assert metadata.slot_mapping_host == (1 * 4 + 1, 2 * 4 + 2)


def test_from_host_rejects_a_shared_page_twice_in_one_row():
    with pytest.raises(InvalidMetadata, match=r"block_table\[0\] holds page 3 twice"):
        BatchMetadata.from_host(
            [[3, 3], [3, -1]], [8, 4], query_len=1, page_size=4, num_pages=8, shared_page_ids=[3]
        )


@pytest.mark.parametrize(
    "fields",
    [((7,),), ((1, 2, 3), (), (-1, 2**31 - 1, -(2**31))), ((5,) * 9, (6,) * 4, (8,))],
)
def test_packed_int32_gives_each_field_back(fields: tuple[tuple[int, ...], ...]) -> None:
    arrays = packed_int32(*fields)
    assert len(arrays) == len(fields)
    for array, field in zip(arrays, fields, strict=True):
        assert array.dtype == mx.int32 and array.shape == (len(field),)
        assert array.tolist() == list(field)
