"""validate_paged_metadata: the host-side value checks the ops deliberately leave out."""

from __future__ import annotations

import pytest

from pagekernels import validate_paged_metadata


def test_valid_metadata_passes():
    validate_paged_metadata(
        [[4, 1, -1], [0, -1, -1], [-1, -1, -1], [2, 3, 5]],
        [7, 2, 0, 9],
        query_len=2,
        page_size=4,
        num_pages=6,
    )


BAD = [
    pytest.param(
        [[0]],
        [1, 1],
        {},
        r"block_table has 1 rows but context_lens has 2 entries",
        id="rows-vs-lens",
    ),
    pytest.param([[0, -1]], [-1], {}, r"context_lens\[0\]=-1 is negative", id="negative-context"),
    pytest.param(
        [[0, -1]],
        [2],
        {"query_len": 3},
        r"context_lens\[0\]=2 is shorter than query_len=3",
        id="shorter-than-query",
    ),
    pytest.param(
        [[0, -1], [1, -1]],
        [4, 5],
        {},
        r"block_table\[1\]\[1\]=-1 is padding, but context_lens\[1\]=5 is not covered: "
        r"it needs 2 pages of 4",
        id="not-covered",
    ),
    pytest.param(
        [[0]],
        [5],
        {},
        r"context_lens\[0\]=5 needs 2 pages of 4 but block_table\[0\] has 1 entries",
        id="too-few-entries",
    ),
    pytest.param(
        [[6, -1]],
        [3],
        {},
        r"block_table\[0\]\[0\]=6 is outside storage; expected a page id in \[0, 6\)",
        id="outside-storage",
    ),
    pytest.param(
        [[-2, -1]],
        [3],
        {},
        r"block_table\[0\]\[0\]=-2 is negative; padding must be -1",
        id="negative-id",
    ),
    pytest.param(
        [[1, 2]],
        [3],
        {},
        r"block_table\[0\]\[1\]=2 follows the row's 1 live pages \(context_lens\[0\]=3\); "
        r"padding must be -1",
        id="padding-not-minus-one",
    ),
    pytest.param(
        [[1, -7]],
        [3],
        {},
        r"block_table\[0\]\[1\]=-7 follows the row's 1 live pages",
        id="negative-padding",
    ),
    pytest.param(
        [[1, -1], [1, -1]],
        [2, 3],
        {},
        r"block_table\[1\]\[0\]=1 repeats page 1 of block_table\[0\]\[0\]",
        id="shared-across-rows",
    ),
    pytest.param(
        [[3, 3]],
        [6],
        {"allow_shared_pages": True},
        r"block_table\[0\]\[1\]=3 repeats page 3 of block_table\[0\]\[0\]",
        id="repeated-in-row",
    ),
    pytest.param([[0]], [1], {"page_size": 0}, r"page_size=0 must be positive", id="page-size"),
    pytest.param([[0]], [1], {"query_len": 0}, r"query_len=0 must be at least 1", id="query-len"),
]


@pytest.mark.parametrize(("table", "lens", "options", "match"), BAD)
def test_rejects(table, lens, options, match):
    kwargs = {"query_len": 1, "page_size": 4, "num_pages": 6} | options
    with pytest.raises(ValueError, match=match):
        validate_paged_metadata(table, lens, **kwargs)


def test_explicit_sharing_across_rows_is_allowed():
    validate_paged_metadata(
        [[1, -1], [1, 2]], [3, 6], query_len=1, page_size=4, num_pages=6, allow_shared_pages=True
    )


def test_a_batch_of_empty_rows_is_valid():
    """Unlike pagepool's BatchMetadata: the kernels return zeros for rows with no keys."""
    validate_paged_metadata([[-1], [-1]], [0, 0], query_len=1, page_size=4, num_pages=6)
