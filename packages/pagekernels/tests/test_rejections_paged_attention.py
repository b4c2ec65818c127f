"""Bad `paged_attention` arguments: rejected at the op boundary with a ValueError that names
what was wrong and what was expected."""

from __future__ import annotations

import mlx.core as mx
import pytest


def _valid_args() -> dict:
    """Valid paged_attention arguments: B=2, Hq=4, Hkv=2, L=1, D=64, P=5, page_size=4."""
    return {
        "queries": mx.zeros((2, 4, 1, 64)),
        "key_pages": mx.zeros((5, 2, 4, 64)),
        "value_pages": mx.zeros((5, 2, 4, 64)),
        "block_table": mx.zeros((2, 3), dtype=mx.int32),
        "context_lens": mx.zeros((2,), dtype=mx.int32),
        "page_size": 4,
    }


CASES = [
    pytest.param(
        {"queries": mx.zeros((2, 4, 64))},
        r"queries must have rank 4 \[B, Hq, L, D\], got shape \(2, 4, 64\)",
        id="queries-rank",
    ),
    pytest.param(
        {"key_pages": mx.zeros((5, 8, 64))}, r"key_pages must have rank 4", id="key-pages-rank"
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 32))},
        r"value_pages must have the shape of key_pages \(5, 2, 4, 64\), got \(5, 2, 4, 32\)",
        id="value-pages-shape",
    ),
    pytest.param(
        {"block_table": mx.zeros((6,), dtype=mx.int32)},
        r"block_table must have rank 2 \[B, max_pages\]",
        id="block-table-rank",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2, 1), dtype=mx.int32)},
        r"context_lens must have rank 1 \[B\]",
        id="context-lens-rank",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 1, 64), dtype=mx.int32)},
        r"queries must be float32, float16 or bfloat16, got int32",
        id="queries-int",
    ),
    pytest.param(
        {"key_pages": mx.zeros((5, 2, 4, 64), dtype=mx.float16)},
        r"key_pages must have the dtype of queries \(float32\), got float16",
        id="key-pages-dtype",
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 64), dtype=mx.float16)},
        r"value_pages must have the dtype of key_pages \(float32\), got float16",
        id="value-pages-dtype",
    ),
    pytest.param(
        {"block_table": mx.zeros((2, 3), dtype=mx.int64)},
        r"block_table must be int32, got int64",
        id="block-table-int64",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2,))},
        r"context_lens must be int32, got float32",
        id="context-lens-float",
    ),
    pytest.param({"page_size": 0}, r"page_size must be positive, got 0", id="page-size-zero"),
    pytest.param({"page_size": -4}, r"page_size must be positive, got -4", id="page-size-negative"),
    pytest.param(
        {"page_size": 8},
        r"key_pages.shape\[2\]=4 \(slots per page\) must equal page_size=8",
        id="page-size-mismatch",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 3, 1, 64))},
        r"query heads Hq=3 must be a multiple of key/value heads Hkv=2",
        id="gqa-ratio",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 1, 32))},
        r"key_pages.shape\[3\]=64 must equal queries.shape\[3\]=32",
        id="head-dim",
    ),
    pytest.param(
        {
            "block_table": mx.zeros((3, 3), dtype=mx.int32),
            "context_lens": mx.zeros((3,), dtype=mx.int32),
        },
        r"block_table.shape\[0\]=3 must equal queries.shape\[0\]=2",
        id="block-table-batch",
    ),
    pytest.param(
        {"context_lens": mx.zeros((1,), dtype=mx.int32)},
        r"context_lens.shape\[0\]=1 must equal block_table.shape\[0\]=2",
        id="context-lens-batch",
    ),
    pytest.param(
        {"mask": "bidirectional"},
        r'mask must be None or "causal", got "bidirectional"',
        id="mask-string",
    ),
    pytest.param({"scale": float("nan")}, r"scale must be a finite number", id="scale-nan"),
]


# A head dim only the GPU kernels refuse; a case where MLX has a GPU (the H200 runs this suite).
if mx.cuda.is_available():
    CASES += [
        pytest.param(
            {"queries": mx.zeros((2, 4, 1, 36)), "key_pages": mx.zeros((5, 2, 4, 36)),
             "value_pages": mx.zeros((5, 2, 4, 36)), "stream": mx.gpu},
            r"head dim D=36 is not supported by the GPU kernels; expected a multiple of 8 up "
            r"to 256",
            id="gpu-head-dim-36",
        ),
    ]  # fmt: skip


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects(assert_rejected, change, match):
    assert_rejected("paged_attention", _valid_args() | change, match)
