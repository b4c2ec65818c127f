"""`add_rms_norm` (a pre-norm block's residual add and RMSNorm in one kernel): both outputs on
every device against the reference equation, strided inputs, `mx.compile`, and bad arguments
rejected at the boundary."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import pagekernels
from pagekernels import reference

EPS = 1e-6


def _inputs(shape: tuple[int, ...], dtype: mx.Dtype, seed: int = 0):
    """residual, update `[*shape]` and weight `[shape[-1]]`, fresh normal values."""
    rng = np.random.default_rng(seed)

    def normal(*dims: int) -> mx.array:
        return mx.array(rng.standard_normal(dims).astype(np.float32)).astype(dtype)

    return normal(*shape), normal(*shape), 1.0 + 0.1 * normal(shape[-1])


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
@pytest.mark.parametrize(
    "shape",
    # decode, prefill, one row, odd H, the GPU kernel's widest row
    [(4, 1, 2560), (2, 17, 192), (64,), (3, 5, 100), (2, 8192)],
    ids=str,
)
def test_matches_the_reference(device, poison_allocator, assert_close, dtype, shape):
    residual, update, weight = _inputs(shape, dtype)
    mx.eval(residual, update, weight)
    poison_allocator(shape, dtype)
    poison_allocator(shape, dtype)
    total, normed = pagekernels.add_rms_norm(residual, update, weight, eps=EPS, stream=device)
    expected_total, expected_normed = reference.add_rms_norm(residual, update, weight, eps=EPS)
    assert_close(total, expected_total)
    assert_close(normed, expected_normed)


def test_strided_inputs(device, assert_close):
    """Views the model passes (the last position of a prefill, a transposed update) are read
    through their strides."""
    residual, _, weight = _inputs((3, 7, 128), mx.bfloat16, seed=1)
    _, update_t, _ = _inputs((3, 128, 7), mx.bfloat16, seed=2)
    last, update = residual[:, -1, :], update_t.transpose(0, 2, 1)[:, 3, :]
    mx.eval(residual, update_t, weight)
    got = pagekernels.add_rms_norm(last, update, weight, eps=EPS, stream=device)
    expected = reference.add_rms_norm(mx.contiguous(last), mx.contiguous(update), weight, eps=EPS)
    for actual, wanted in zip(got, expected, strict=True):
        assert_close(actual, wanted)


def test_rank3_inputs_out_of_memory_order(device, assert_close):
    """Leading dims that are not in memory order (a transposed batch): the GPU path copies them
    to row-major itself, the CPU path reshapes."""
    residual_t, update_t, weight = _inputs((5, 3, 96), mx.float16, seed=6)
    residual, update = residual_t.transpose(1, 0, 2), update_t.transpose(1, 0, 2)
    mx.eval(residual_t, update_t, weight)
    got = pagekernels.add_rms_norm(residual, update, weight, eps=EPS, stream=device)
    expected = reference.add_rms_norm(
        mx.contiguous(residual), mx.contiguous(update), weight, eps=EPS
    )
    for actual, wanted in zip(got, expected, strict=True):
        assert actual.shape == (3, 5, 96)
        assert_close(actual, wanted)


def test_calls_with_different_eps_stay_apart_under_compile(device, assert_close):
    """`AddRMSNorm` compares eps: two calls on the same inputs are not merged by `mx.compile`."""
    inputs = _inputs((2, 128), mx.float32, seed=7)

    def both(*args: mx.array) -> tuple[mx.array, mx.array]:
        tight = pagekernels.add_rms_norm(*args, eps=1e-6, stream=device)[1]
        loose = pagekernels.add_rms_norm(*args, eps=10.0, stream=device)[1]
        return tight, loose

    tight, loose = mx.compile(both)(*inputs)
    assert_close(tight, reference.add_rms_norm(*inputs, eps=1e-6)[1])
    assert_close(loose, reference.add_rms_norm(*inputs, eps=10.0)[1])


def test_runs_inside_compile(device, assert_close):
    def block(residual: mx.array, update: mx.array, weight: mx.array) -> tuple[mx.array, ...]:
        return pagekernels.add_rms_norm(residual, update, weight, eps=EPS, stream=device)

    compiled = mx.compile(block)
    for seed in (3, 4):  # the second call replays the trace on new values
        inputs = _inputs((2, 1, 256), mx.float32, seed=seed)
        for actual, wanted in zip(
            compiled(*inputs), reference.add_rms_norm(*inputs, eps=EPS), strict=True
        ):
            assert_close(actual, wanted)


def _valid_args() -> dict:
    residual, update, weight = _inputs((2, 64), mx.bfloat16)
    return {"residual": residual, "update": update, "weight": weight, "eps": EPS}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"residual": mx.array(1.0, dtype=mx.bfloat16)}, r"residual must have rank >= 1"),
        ({"update": mx.zeros((2, 32), dtype=mx.bfloat16)}, r"update must have the shape of"),
        ({"weight": mx.zeros((2, 64), dtype=mx.bfloat16)}, r"weight must have rank 1 \[H\]"),
        ({"weight": mx.zeros((32,), dtype=mx.bfloat16)}, r"weight.shape\[0\]=32"),
        (
            {"update": mx.zeros((2, 64), dtype=mx.float32)},
            r"update must have the dtype of residual \(bfloat16\), got float32",
        ),
        ({"residual": mx.zeros((2, 64), dtype=mx.int32)}, r"residual must be float32, float16"),
        ({"eps": 0.0}, r"eps must be a finite positive number, got 0"),
        ({"eps": float("nan")}, r"eps must be a finite positive number"),
    ],
    ids=["scalar", "shapes", "weight-rank", "width", "dtypes", "int", "eps-zero", "eps-nan"],
)
def test_bad_arguments_are_rejected(assert_rejected, change, match):
    assert_rejected("add_rms_norm", {**_valid_args(), **change}, match)


def test_rows_wider_than_the_gpu_kernel_take_mlx_ops_there(device, assert_close, tmp_path):
    """The CPU kernel takes any width; on a GPU stream rows past 8192 elements run MLX's add
    and rms_norm."""
    inputs = _inputs((2, 8200), mx.float32, seed=5)
    got = pagekernels.add_rms_norm(*inputs, eps=EPS, stream=device)
    graph = tmp_path / "graph.dot"
    mx.export_to_dot(str(graph), *got)
    assert ("AddRMSNorm" in graph.read_text()) == (device == mx.cpu)
    for actual, wanted in zip(got, reference.add_rms_norm(*inputs, eps=EPS), strict=True):
        assert_close(actual, wanted, tol=1e-4 if device == mx.gpu else None)


@pytest.mark.parametrize("shape", [(3, 0), (0, 16)], ids=str)
def test_empty_inputs_give_empty_outputs(device, shape):
    residual, update, weight = _inputs(shape, mx.float32)
    total, normed = pagekernels.add_rms_norm(residual, update, weight, eps=EPS, stream=device)
    assert total.shape == normed.shape == shape


def test_rank9_inputs_out_of_memory_order(device, assert_close):
    """Ranks above what eval_gpu copies itself (8) are reshaped on the host first."""
    residual_t, update_t, weight = _inputs((1, 1, 1, 1, 1, 1, 2, 3, 64), mx.float32, seed=8)
    order = (0, 1, 2, 3, 4, 5, 7, 6, 8)
    residual, update = residual_t.transpose(order), update_t.transpose(order)
    got = pagekernels.add_rms_norm(residual, update, weight, eps=EPS, stream=device)
    expected = reference.add_rms_norm(
        mx.contiguous(residual), mx.contiguous(update), weight, eps=EPS
    )
    for actual, wanted in zip(got, expected, strict=True):
        assert actual.shape == (1, 1, 1, 1, 1, 1, 3, 2, 64)
        assert_close(actual, wanted)
