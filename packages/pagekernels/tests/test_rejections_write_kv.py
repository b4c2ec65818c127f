"""Bad `write_kv` arguments: rejected at the op boundary with a ValueError that names
what was wrong and what was expected; the pages are left unchanged."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest


def _valid_args() -> dict:
    """Valid write_kv arguments: P=3, Hkv=2, page_size=4, D=8, T=5 (random pages)."""
    return {
        "key_pages": mx.random.normal((3, 2, 4, 8)),
        "value_pages": mx.random.normal((3, 2, 4, 8)),
        "keys": mx.ones((5, 2, 8)),
        "values": mx.ones((5, 2, 8)),
        "slot_mapping": mx.arange(5, dtype=mx.int32),
    }


CASES = [
    pytest.param(
        {"key_pages": mx.zeros((3, 2, 32))},
        r"key_pages must have rank 4 \[P, Hkv, page_size, D\]",
        id="pages-rank",
    ),
    pytest.param(
        {"value_pages": mx.zeros((4, 2, 4, 8))},
        r"value_pages must have the shape of key_pages",
        id="value-pages-shape",
    ),
    pytest.param(
        {"keys": mx.ones((5, 16))}, r"keys must have rank 3 \[T, Hkv, D\]", id="keys-rank"
    ),
    pytest.param(
        {"values": mx.ones((4, 2, 8))},
        r"values must have the shape of keys \(5, 2, 8\), got \(4, 2, 8\)",
        id="values-shape",
    ),
    pytest.param(
        {"slot_mapping": mx.zeros((5, 1), dtype=mx.int32)},
        r"slot_mapping must have rank 1 \[T\]",
        id="slots-rank",
    ),
    pytest.param(
        {
            "key_pages": mx.zeros((3, 2, 4, 8), dtype=mx.int32),
            "value_pages": mx.zeros((3, 2, 4, 8), dtype=mx.int32),
        },
        r"key_pages must be float32, float16 or bfloat16, got int32",
        id="pages-int",
    ),
    pytest.param(
        {"keys": mx.ones((5, 2, 8), dtype=mx.float16)},
        r"keys must have the dtype of key_pages \(float32\), got float16",
        id="keys-dtype",
    ),
    pytest.param(
        {"slot_mapping": mx.arange(5, dtype=mx.int64)},
        r"slot_mapping must be int32, got int64",
        id="slots-int64",
    ),
    pytest.param(
        {"keys": mx.ones((5, 1, 8)), "values": mx.ones((5, 1, 8))},
        r"keys.shape\[1\]=1 must equal key_pages.shape\[1\]=2",
        id="kv-heads",
    ),
    pytest.param(
        {"keys": mx.ones((5, 2, 4)), "values": mx.ones((5, 2, 4))},
        r"keys.shape\[2\]=4 must equal key_pages.shape\[3\]=8",
        id="head-dim",
    ),
    pytest.param(
        {"slot_mapping": mx.arange(4, dtype=mx.int32)},
        r"slot_mapping.shape\[0\]=4 must equal keys.shape\[0\]=5",
        id="tokens",
    ),
]


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects_and_changes_nothing(assert_rejected, change, match):
    inputs = _valid_args() | change
    before = [np.array(inputs[name].astype(mx.float32)) for name in ("key_pages", "value_pages")]
    assert_rejected("write_kv", inputs, match)
    for name, host in zip(("key_pages", "value_pages"), before, strict=True):
        np.testing.assert_array_equal(np.array(inputs[name].astype(mx.float32)), host)
