"""Bad `gather_kv` arguments: rejected at the op boundary with a ValueError that names
what was wrong and what was expected."""

from __future__ import annotations

import mlx.core as mx
import pytest


def _valid_args() -> dict:
    """Valid gather_kv arguments: P=5, Hkv=2, page_size=4, D=8, B=2, max_pages=3."""
    return {
        "key_pages": mx.zeros((5, 2, 4, 8)),
        "value_pages": mx.zeros((5, 2, 4, 8)),
        "block_table": mx.zeros((2, 3), dtype=mx.int32),
        "context_lens": mx.zeros((2,), dtype=mx.int32),
        "page_size": 4,
    }


CASES = [
    pytest.param(
        {"key_pages": mx.zeros((5, 8, 8))}, r"key_pages must have rank 4", id="pages-rank"
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 4))},
        r"value_pages must have the shape of key_pages",
        id="value-pages-shape",
    ),
    pytest.param(
        {"block_table": mx.zeros((6,), dtype=mx.int32)},
        r"block_table must have rank 2",
        id="block-table-rank",
    ),
    pytest.param(
        {"context_lens": mx.zeros((), dtype=mx.int32)},
        r"context_lens must have rank 1",
        id="context-lens-rank",
    ),
    pytest.param(
        {
            "key_pages": mx.zeros((5, 2, 4, 8), dtype=mx.bool_),
            "value_pages": mx.zeros((5, 2, 4, 8), dtype=mx.bool_),
        },
        r"key_pages must be float32, float16 or bfloat16, got bool",
        id="pages-bool",
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 8), dtype=mx.float16)},
        r"value_pages must have the dtype of key_pages",
        id="values-dtype",
    ),
    pytest.param(
        {"block_table": mx.zeros((2, 3), dtype=mx.uint32)},
        r"block_table must be int32, got uint32",
        id="block-table-dtype",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2,), dtype=mx.int16)},
        r"context_lens must be int32, got int16",
        id="context-lens-dtype",
    ),
    pytest.param({"page_size": 0}, r"page_size must be positive, got 0", id="page-size-zero"),
    pytest.param(
        {"page_size": 2},
        r"key_pages.shape\[2\]=4 \(slots per page\) must equal page_size=2",
        id="page-size-mismatch",
    ),
    pytest.param(
        {"context_lens": mx.zeros((3,), dtype=mx.int32)},
        r"context_lens.shape\[0\]=3 must equal block_table.shape\[0\]=2",
        id="batch",
    ),
]


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects(assert_rejected, change, match):
    assert_rejected("gather_kv", _valid_args() | change, match)
