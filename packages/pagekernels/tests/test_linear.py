"""`linear` (x @ weight.T for decode-step projections): the kernel on every device against the
float32 equation, the automatic choice between kernel and `mx.matmul`, and bad arguments
rejected at the boundary."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import pagekernels
from pagekernels import _ext


def _inputs(rows: tuple[int, ...], n: int, k: int, dtype: mx.Dtype, seed: int = 0):
    """x `[*rows, k]` and weight `[n, k]` scaled so each output is about N(0, 1)."""
    rng = np.random.default_rng(seed)
    x = mx.array(rng.standard_normal((*rows, k)).astype(np.float32)).astype(dtype)
    w = mx.array((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)).astype(dtype)
    return x, w


def _oracle(x: mx.array, w: mx.array) -> mx.array:
    """The float32 equation, rounded once to the inputs' dtype."""
    return (x.astype(mx.float32) @ w.astype(mx.float32).T).astype(x.dtype)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    ("rows", "n", "k"),
    [
        ((1,), 64, 64),
        ((3,), 17, 128),  # columns not a multiple of the kernel's 16
        ((8,), 1000, 2560),  # one m8 tile, Qwen3-4B's hidden size
        ((9,), 40, 192),  # two m8 tiles, the second partly empty
        ((2, 8), 33, 4096),  # leading dims flattened, 16 rows
        ((4,), 2560, 9728),  # Qwen3-4B down_proj at batch 4
    ],
)
def test_kernel_matches_the_equation(device, poison_allocator, assert_close, dtype, rows, n, k):
    x, w = _inputs(rows, n, k, dtype)
    mx.eval(x, w)
    poison_allocator((int(np.prod(rows)), n), dtype)
    out = _ext.linear(x, w, use_kernel=True, stream=device)
    assert_close(out, _oracle(x, w))


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("rows", [(4,), (17,), (2, 9)], ids=["4", "17", "2x9"])
def test_automatic_choice(device, dtype, rows):
    """The kernel exactly where it applies (GPU, 16-bit, <= 16 rows), `mx.matmul` elsewhere."""
    x, w = _inputs(rows, 48, 128, dtype, seed=1)
    mx.eval(x, w)
    out = pagekernels.linear(x, w, stream=device)
    rows_total = int(np.prod(rows))
    kernel = device == mx.gpu and dtype != mx.float32 and rows_total <= _ext.linear_max_rows
    expected = _ext.linear(x, w, use_kernel=kernel, stream=device)
    np.testing.assert_array_equal(
        np.array(out.astype(mx.float32)), np.array(expected.astype(mx.float32))
    )
    matmul = _ext.linear(x, w, use_kernel=False, stream=device)
    np.testing.assert_array_equal(
        np.array(matmul.astype(mx.float32)),
        np.array(mx.matmul(x, w.T, stream=device).astype(mx.float32)),
    )


def test_empty_rows_give_an_empty_result(device):
    x, w = _inputs((0,), 32, 64, mx.bfloat16)
    out = _ext.linear(x, w, use_kernel=True, stream=device)
    assert out.shape == (0, 32) and out.dtype == mx.bfloat16


def test_reference_backend_is_the_equation():
    x, w = _inputs((3,), 20, 64, mx.float32)
    np.testing.assert_array_equal(
        np.array(pagekernels.get_backend("reference").linear(x, w)), np.array(x @ w.T)
    )


def _valid_args() -> dict:
    x, w = _inputs((4,), 32, 64, mx.bfloat16)
    return {"x": x, "weight": w}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"weight": mx.zeros((32, 64, 1), dtype=mx.bfloat16)}, r"weight must have rank 2 \[N, K\]"),
        (
            {"x": mx.array(1.0, dtype=mx.bfloat16)},
            r"x must have rank >= 1 \[\.\.\., K\], got a scalar",
        ),
        (
            {"x": mx.zeros((4, 64), dtype=mx.int32)},
            r"x must be float32, float16 or bfloat16, got int32",
        ),
        (
            {"x": mx.zeros((4, 64), dtype=mx.float16)},
            r"weight must have the dtype of x \(float16\), got bfloat16",
        ),
        (
            {"x": mx.zeros((4, 48), dtype=mx.bfloat16)},
            r"x.shape\[-1\]=48 must equal weight.shape\[1\]=64 \(K\)",
        ),
    ],
    ids=["weight-rank", "x-scalar", "x-int", "dtype-mismatch", "depth"],
)
def test_bad_arguments_are_rejected(assert_rejected, change, match):
    assert_rejected("linear", {**_valid_args(), **change}, match)


@pytest.mark.parametrize(
    ("x_shape", "k", "dtype", "match"),
    [
        ((17, 64), 64, mx.bfloat16, r"the kernel takes at most 16 rows, got 17"),
        ((4, 96), 96, mx.bfloat16, r"the kernel needs K % 64 == 0, got K=96"),
        ((4, 64), 64, mx.float32, r"the kernel takes float16 or bfloat16, got float32"),
    ],
    ids=["rows", "depth", "float32"],
)
def test_forcing_the_kernel_where_it_does_not_apply_is_rejected(x_shape, k, dtype, match):
    x = mx.zeros(x_shape, dtype=dtype)
    w = mx.zeros((8, k), dtype=dtype)
    with pytest.raises(ValueError, match=r"^\[linear\] use_kernel=True but " + match):
        _ext.linear(x, w, use_kernel=True)
