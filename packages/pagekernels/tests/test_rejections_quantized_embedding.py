"""Bad `quantized_embedding` arguments: rejected at the op boundary with a ValueError that names
what was wrong and what was expected."""

from __future__ import annotations

import mlx.core as mx
import pytest


def _valid_args() -> dict:
    """Valid quantized_embedding arguments: V=6, dims=128, bits=4, group_size=64."""
    weight, scales, biases = mx.quantize(mx.zeros((6, 128)), group_size=64, bits=4)
    return {
        "indices": mx.array([1, 2], dtype=mx.int32),
        "weight": weight,
        "scales": scales,
        "biases": biases,
        "group_size": 64,
        "bits": 4,
    }


CASES = [
    pytest.param(
        {"indices": mx.array([1.0])},
        r"indices must have an integer dtype, got float32",
        id="float-indices",
    ),
    pytest.param(
        {"bits": 7},
        r"bits must be one of 1, 2, 3, 4, 5, 6, 8 \(mx.quantize affine\), got 7",
        id="bits-7",
    ),
    pytest.param({"bits": 16}, r"bits must be one of .*, got 16", id="bits-16"),
    pytest.param(
        {"group_size": 16}, r"group_size must be one of 32, 64, 128, got 16", id="group-16"
    ),
    pytest.param(
        {"weight": mx.zeros((6 * 16,), dtype=mx.uint32)},
        r"weight must have rank 2 \[V, dims \* bits / 32\]",
        id="weight-rank",
    ),
    pytest.param(
        {"weight": mx.zeros((6, 16), dtype=mx.int32)},
        r"weight must be uint32, got int32",
        id="weight-dtype",
    ),
    pytest.param(
        {"scales": mx.zeros((12,))},
        r"scales must have rank 2 \[V, dims / group_size\]",
        id="scales-rank",
    ),
    pytest.param(
        {"scales": mx.zeros((6, 2), dtype=mx.int32), "biases": mx.zeros((6, 2), dtype=mx.int32)},
        r"scales must be float32, float16 or bfloat16, got int32",
        id="scales-int",
    ),
    pytest.param(
        {"biases": mx.zeros((6, 4))},
        r"biases must have the shape of scales \(6, 2\), got \(6, 4\)",
        id="biases-shape",
    ),
    pytest.param(
        {"biases": mx.zeros((6, 2), dtype=mx.float16)},
        r"biases must have the dtype of scales",
        id="biases-dtype",
    ),
    pytest.param(
        {"scales": mx.zeros((5, 2)), "biases": mx.zeros((5, 2))},
        r"scales.shape\[0\]=5 must equal weight.shape\[0\]=6",
        id="rows",
    ),
    pytest.param(
        {"group_size": 32},
        r"scales.shape\[1\]=2 must equal dims / group_size = 128 / 32",
        id="groups",
    ),
    pytest.param(
        {"bits": 3, "weight": mx.zeros((6, 1), dtype=mx.uint32)},
        r"weight.shape\[1\]=1 uint32 words do not hold a whole number of 3-bit values",
        id="packing",
    ),
]


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects(assert_rejected, change, match):
    assert_rejected("quantized_embedding", _valid_args() | change, match)
