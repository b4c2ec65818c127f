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


def _ran_kernel(out: mx.array, path) -> bool:
    """Whether `out`'s graph holds our Linear primitive (else it is MLX's matmul)."""
    mx.export_to_dot(str(path), out)
    return "Linear" in path.read_text()


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize(
    ("rows", "k"), [((16,), 128), ((17,), 128), ((2, 8), 64), ((4,), 96)], ids=str
)
def test_automatic_choice(device, assert_close, tmp_path, dtype, rows, k):
    """The kernel exactly on a GPU stream for 16-bit inputs with <= 16 rows and K % 64 == 0,
    `mx.matmul` everywhere else; the result is the equation either way."""
    x, w = _inputs(rows, 48, k, dtype, seed=1)
    mx.eval(x, w)
    out = pagekernels.linear(x, w, stream=device)
    applies = dtype != mx.float32 and int(np.prod(rows)) <= _ext.linear_max_rows and k % 64 == 0
    assert _ran_kernel(out, tmp_path / "graph.dot") == (device == mx.gpu and applies)
    assert_close(out, _oracle(x, w), tol=2e-2 if dtype != mx.float32 else 1e-4)


def test_mixed_dtypes_promote_like_matmul(device, tmp_path):
    x, w = _inputs((4,), 32, 64, mx.bfloat16)
    w = w.astype(mx.float32)
    out = pagekernels.linear(x, w, stream=device)
    assert out.dtype == mx.float32
    assert not _ran_kernel(out, tmp_path / "graph.dot")
    np.testing.assert_allclose(np.array(out), np.array(x.astype(mx.float32) @ w.T), atol=1e-4)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bf16", "f16"])
def test_views_at_an_offset_and_transposed_weights(device, poison_allocator, assert_close, dtype):
    """Inputs the kernel cannot load as aligned rows (a slice 2 bytes into its buffer, a weight
    read through a transpose) are copied first, never misread or rejected at eval."""
    x_wide, _ = _inputs((3,), 8, 129, dtype, seed=5)
    x = x_wide[:, 1:]  # row-contiguous rows of 128, starting one element in
    _, w_t = _inputs((1,), 128, 40, dtype, seed=6)
    w = w_t.T  # [40, 128] view with strides (1, 40)
    mx.eval(x_wide, w_t)
    poison_allocator((3, 40), dtype)
    out = _ext.linear(x, w, use_kernel=True, stream=device)
    assert_close(out, _oracle(mx.contiguous(x), mx.contiguous(w)))


def test_a_transposed_batch_of_rows(device, poison_allocator, assert_close):
    """x of rank 3 whose rows are not in memory order (the GPU path reads leading dims as rows
    itself and copies such an x first; the CPU path reshapes it)."""
    x_t, w = _inputs((3, 2), 48, 128, mx.bfloat16, seed=11)
    x = x_t.transpose(1, 0, 2)  # [2, 3, 128], strides (128, 256, 1)
    mx.eval(x_t, w)
    poison_allocator((2, 3, 48), mx.bfloat16)
    out = _ext.linear(x, w, use_kernel=True, stream=device)
    assert out.shape == (2, 3, 48)
    assert_close(out, _oracle(mx.contiguous(x), w))


def test_rank9_x_out_of_memory_order(device, assert_close):
    """Ranks above what eval_gpu copies itself (8) are reshaped to rows on the host first."""
    x_t, w = _inputs((1, 1, 1, 1, 1, 1, 2, 3), 32, 64, mx.bfloat16, seed=16)
    x = x_t.transpose(0, 1, 2, 3, 4, 5, 7, 6, 8)
    out = _ext.linear(x, w, use_kernel=True, stream=device)
    assert out.shape == (1, 1, 1, 1, 1, 1, 3, 2, 32)
    assert_close(out, _oracle(mx.contiguous(x), w))


def test_the_cpu_loop_takes_any_float_rows_and_depth(assert_close):
    """Forced on the CPU, the kernel contract holds without the GPU kernel's limits."""
    x, w = _inputs((20,), 24, 100, mx.float32, seed=7)
    out = _ext.linear(x, w, use_kernel=True, stream=mx.cpu)
    assert_close(out, _oracle(x, w))


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
            {"weight": mx.zeros((32, 64), dtype=mx.int8)},
            r"weight must be float32, float16 or bfloat16, got int8",
        ),
        (
            {"x": mx.zeros((4, 48), dtype=mx.bfloat16)},
            r"x.shape\[-1\]=48 must equal weight.shape\[1\]=64 \(K\)",
        ),
    ],
    ids=["weight-rank", "x-scalar", "x-int", "weight-int", "depth"],
)
def test_bad_arguments_are_rejected(assert_rejected, change, match):
    assert_rejected("linear", {**_valid_args(), **change}, match)


def test_forcing_the_kernel_on_mixed_dtypes_is_rejected(device):
    x = mx.zeros((4, 64), dtype=mx.float16)
    w = mx.zeros((8, 64), dtype=mx.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"^\[linear\] use_kernel=True but the kernel takes x and weight of one dtype, "
        r"got float16 and bfloat16",
    ):
        _ext.linear(x, w, use_kernel=True, stream=device)


def _gpu_only(test):
    """Keeps `test` only where MLX has a CUDA GPU (pytest collects no `None` attribute)."""
    return test if mx.cuda.is_available() else None


@_gpu_only
@pytest.mark.parametrize(
    ("x_shape", "k", "dtype", "match"),
    [
        ((17, 64), 64, mx.bfloat16, r"the CUDA kernel takes at most 16 rows, got 17"),
        ((4, 96), 96, mx.bfloat16, r"the CUDA kernel needs K % 64 == 0, got K=96"),
        ((4, 64), 64, mx.float32, r"the CUDA kernel takes float16 or bfloat16, got float32"),
    ],
    ids=["rows", "depth", "float32"],
)
def test_forcing_the_cuda_kernel_where_it_does_not_apply_is_rejected(x_shape, k, dtype, match):
    """Checked when the op is built for a GPU stream."""
    x = mx.zeros(x_shape, dtype=dtype)
    w = mx.zeros((8, k), dtype=dtype)
    with pytest.raises(ValueError, match=r"^\[linear\] use_kernel=True but " + match):
        _ext.linear(x, w, use_kernel=True, stream=mx.gpu)


# split_linear: stacked weights, one contiguous output per part.


def _parts_oracle(x: mx.array, w: mx.array, widths: tuple[int, ...]) -> list[mx.array]:
    boundaries = list(np.cumsum(widths)[:-1])
    return mx.split(_oracle(x, w), boundaries, axis=-1)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    ("rows", "widths", "k"),
    [
        ((4,), (64, 16, 16), 128),  # q, k, v of a GQA layer in miniature
        ((9,), (20, 7, 13, 24), 64),  # parts that straddle the kernel's 16-column tiles
        ((2, 3), (48, 48), 2560),  # gate and up at Qwen3-4B's hidden size
        ((1,), (0, 32, 16), 64),  # an empty part
    ],
    ids=str,
)
def test_split_kernel_matches_the_equation(
    device, poison_allocator, assert_close, dtype, rows, widths, k
):
    x, w = _inputs(rows, sum(widths), k, dtype, seed=8)
    mx.eval(x, w)
    for width in widths:
        poison_allocator((int(np.prod(rows)), width), dtype)
    parts = _ext.split_linear(x, w, widths, use_kernel=True, stream=device)
    assert [p.shape for p in parts] == [(*rows, width) for width in widths]
    for part, expected in zip(parts, _parts_oracle(x, w, widths), strict=True):
        assert_close(part, expected)


def test_split_parts_come_from_one_product(device, tmp_path):
    """Where the kernel applies the parts are outputs of one Linear node (no Split or Slice
    after it); elsewhere they are a split matmul."""
    x, w = _inputs((4,), 96, 128, mx.bfloat16, seed=9)
    parts = pagekernels.split_linear(x, w, (64, 32), stream=device)
    graph = tmp_path / "graph.dot"
    mx.export_to_dot(str(graph), *parts)
    text = graph.read_text()
    assert ("Linear" in text and "Slice" not in text) == (device == mx.gpu)


def test_split_runs_inside_compile(assert_close):
    """The multi-output primitive traces and replays under `mx.compile`."""
    x, w = _inputs((3,), 40, 64, mx.float32, seed=10)

    def project(x: mx.array, w: mx.array) -> list[mx.array]:
        return _ext.split_linear(x, w, (24, 16), use_kernel=True, stream=mx.cpu)

    compiled = mx.compile(project)
    for seed in (10, 11):  # the second call replays the trace on new values
        x, w = _inputs((3,), 40, 64, mx.float32, seed=seed)
        for part, expected in zip(compiled(x, w), _parts_oracle(x, w, (24, 16)), strict=True):
            assert_close(part, expected)


def test_splits_with_different_widths_stay_apart_under_compile(device, assert_close):
    """`Linear` compares widths: the same product split two ways is not merged by `mx.compile`."""
    x, w = _inputs((4,), 40, 64, mx.bfloat16, seed=15)

    def both(x: mx.array, w: mx.array) -> list[mx.array]:
        return [
            *_ext.split_linear(x, w, (24, 16), use_kernel=True, stream=device),
            *_ext.split_linear(x, w, (16, 24), use_kernel=True, stream=device),
        ]

    parts = mx.compile(both)(x, w)
    assert [p.shape for p in parts] == [(4, 24), (4, 16), (4, 16), (4, 24)]
    expected = [*_parts_oracle(x, w, (24, 16)), *_parts_oracle(x, w, (16, 24))]
    for part, wanted in zip(parts, expected, strict=True):
        assert_close(part, wanted)


def test_split_reference_backend_is_the_split_equation():
    x, w = _inputs((3,), 20, 64, mx.float32)
    parts = pagekernels.get_backend("reference").split_linear(x, w, (5, 15))
    for part, expected in zip(parts, mx.split(x @ w.T, [5], axis=-1), strict=True):
        np.testing.assert_array_equal(np.array(part), np.array(expected))


@pytest.mark.parametrize(
    ("widths", "match"),
    [
        ((16, 8), r"widths must be .* summing to weight.shape\[0\]=32 \(N\), got \[16, 8\]"),
        ((40, -8), r"widths must be 1 to 4 non-negative .*got \[40, -8\]"),
        ((), r"widths must be 1 to 4 .*got \[\]"),
        ((8, 8, 8, 4, 4), r"widths must be 1 to 4 .*got \[8, 8, 8, 4, 4\]"),
    ],
    ids=["sum", "negative", "none", "five"],
)
def test_split_bad_widths_are_rejected(assert_rejected, widths, match):
    assert_rejected("split_linear", {**_valid_args(), "widths": widths}, match)
