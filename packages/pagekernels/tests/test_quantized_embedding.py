"""quantized_embedding against mx.dequantize of the selected rows."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import quantized_embedding, reference

GRID = [(bits, group_size) for bits in (4, 8) for group_size in (32, 64, 128)] + [
    (2, 64),
    (3, 32),
    (5, 128),
    (6, 64),
]


def _table(vocab: int, dims: int, dtype: mx.Dtype, seed: int):
    weights = mx.array(np.random.default_rng(seed).standard_normal((vocab, dims)), dtype=dtype)
    return weights


@pytest.mark.parametrize(("bits", "group_size"), GRID, ids=[f"b{b}-g{g}" for b, g in GRID])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_matches_dequantize(device, assert_close, poison_allocator, bits, group_size, dtype):
    vocab, dims = 53, 256
    weight, scales, biases = mx.quantize(
        _table(vocab, dims, dtype, bits * group_size), group_size=group_size, bits=bits
    )
    indices = mx.array([[3, 0, 52], [17, 17, 8]], dtype=mx.int32)
    dequantized = mx.dequantize(weight, scales, biases, group_size=group_size, bits=bits)
    expected = dequantized[indices]
    poison_allocator((6, dims), dtype)
    out = quantized_embedding(
        indices, weight, scales, biases, group_size=group_size, bits=bits, stream=device
    )
    # f32: the same products, maybe fused differently; bf16: one rounding of the same value.
    assert_close(out, expected, tol=1e-6 if dtype == mx.float32 else None)


@pytest.mark.parametrize(
    "index_dtype", [mx.int32, mx.int64, mx.uint32, mx.int16, mx.uint8], ids=str
)
def test_any_integer_indices_and_out_of_range_rows_are_zeros(device, assert_close, index_dtype):
    vocab, dims = 40, 64
    weight, scales, biases = mx.quantize(_table(vocab, dims, mx.float16, 7), group_size=32, bits=4)
    values = [5, 39, 40, 255, 0] + ([-1, -(2**31)] if index_dtype in (mx.int32, mx.int64) else [])
    if index_dtype == mx.int64:
        values.append(2**32 + 1)  # must not wrap to row 1 through int32 truncation
    if index_dtype == mx.uint32:
        values.append(2**31 + 7)
    indices = mx.array(values, dtype=mx.int64).astype(index_dtype)
    out = quantized_embedding(indices, weight, scales, biases, group_size=32, bits=4, stream=device)
    expected = reference.quantized_embedding(indices, weight, scales, biases, group_size=32, bits=4)
    assert_close(out, expected)
    host = np.array(indices.astype(mx.int64)).tolist()
    out_np = np.array(out.astype(mx.float32))
    for i, index in enumerate(host):
        assert (out_np[i] == 0).all() == (not 0 <= index < vocab), (i, index)


def test_keeps_the_index_shape(device, assert_close):
    weight, scales, biases = mx.quantize(_table(10, 128, mx.float32, 3), group_size=64, bits=8)
    scalar = quantized_embedding(
        mx.array(4), weight, scales, biases, group_size=64, bits=8, stream=device
    )
    assert scalar.shape == (128,)
    cube = mx.array(np.arange(24).reshape(2, 3, 4) % 10, dtype=mx.int32)
    out = quantized_embedding(cube, weight, scales, biases, group_size=64, bits=8, stream=device)
    assert out.shape == (2, 3, 4, 128)
    expected = mx.dequantize(weight, scales, biases, group_size=64, bits=8)[cube]
    assert_close(out, expected, tol=1e-6)


def test_reads_a_strided_table(device, assert_close):
    """Every other row of a quantized table (packed words, scales and biases all strided)."""
    weight, scales, biases = mx.quantize(_table(40, 128, mx.bfloat16, 3), group_size=64, bits=4)
    rows = (weight[::2], scales[::2], biases[::2])
    indices = mx.array([0, 7, 19], dtype=mx.int32)
    expected = mx.dequantize(*[mx.contiguous(a) for a in rows], group_size=64, bits=4)[indices]
    out = quantized_embedding(indices, *rows, group_size=64, bits=4, stream=device)
    assert_close(out, expected)
