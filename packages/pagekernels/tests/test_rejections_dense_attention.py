"""Bad `dense_attention` arguments: rejected at the op boundary with a ValueError that names
what was wrong and what was expected."""

from __future__ import annotations

import mlx.core as mx
import pytest


def _valid_args() -> dict:
    """Valid dense_attention arguments: B=2, Hq=4, Hkv=2, L=3, S=10, D=64."""
    return {
        "queries": mx.zeros((2, 4, 3, 64)),
        "keys": mx.zeros((2, 2, 10, 64)),
        "values": mx.zeros((2, 2, 10, 64)),
        "key_lens": mx.zeros((2,), dtype=mx.int32),
    }


CASES = [
    pytest.param(
        {"queries": mx.zeros((4, 3, 64))},
        r"queries must have rank 4 \[B, Hq, L, D\]",
        id="queries-rank",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 10, 64))}, r"keys must have rank 4 \[B, Hkv, S, D\]", id="keys-rank"
    ),
    pytest.param(
        {"values": mx.zeros((2, 2, 9, 64))},
        r"values must have the shape of keys \(2, 2, 10, 64\), got \(2, 2, 9, 64\)",
        id="values-shape",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 3, 64), dtype=mx.uint8)},
        r"queries must be float32, float16 or bfloat16, got uint8",
        id="queries-uint8",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 2, 10, 64), dtype=mx.bfloat16)},
        r"keys must have the dtype of queries \(float32\), got bfloat16",
        id="keys-dtype",
    ),
    pytest.param(
        {"values": mx.zeros((2, 2, 10, 64), dtype=mx.float16)},
        r"values must have the dtype of queries",
        id="values-dtype",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 3, 128))},
        r"keys.shape\[3\]=64 must equal queries.shape\[3\]=128",
        id="head-dim",
    ),
    pytest.param(
        {"keys": mx.zeros((1, 2, 10, 64)), "values": mx.zeros((1, 2, 10, 64))},
        r"keys.shape\[0\]=1 must equal queries.shape\[0\]=2",
        id="batch",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 3, 10, 64)), "values": mx.zeros((2, 3, 10, 64))},
        r"query heads Hq=4 must be a multiple of key/value heads Hkv=3",
        id="gqa-ratio",
    ),
    pytest.param(
        {"key_lens": mx.zeros((2, 1), dtype=mx.int32)},
        r"key_lens must have rank 1 \[B\]",
        id="key-lens-rank",
    ),
    pytest.param(
        {"key_lens": mx.zeros((2,), dtype=mx.int64)},
        r"key_lens must be int32, got int64",
        id="key-lens-dtype",
    ),
    pytest.param(
        {"key_lens": mx.zeros((3,), dtype=mx.int32)},
        r"key_lens.shape\[0\]=3 must equal queries.shape\[0\]=2",
        id="key-lens-batch",
    ),
    pytest.param(
        {"mask": "lower"}, r'mask must be None or "causal", got "lower"', id="mask-string"
    ),
]


# A head dim only the GPU kernels refuse; a case where MLX has a GPU (the H200 runs this suite).
if mx.cuda.is_available():
    CASES += [
        pytest.param(
            {"queries": mx.zeros((2, 4, 3, 264)), "keys": mx.zeros((2, 2, 10, 264)),
             "values": mx.zeros((2, 2, 10, 264)), "stream": mx.gpu},
            r"head dim D=264 is not supported by the GPU kernels; expected a multiple of 8 "
            r"up to 256",
            id="gpu-head-dim-264",
        ),
    ]  # fmt: skip


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects(assert_rejected, change, match):
    assert_rejected("dense_attention", _valid_args() | change, match)
