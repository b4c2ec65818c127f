"""`norm_rope` (RMSNorm + RoPE of one projection, fused): the kernel on every device against the
reference composition of `mx.fast.rms_norm` and `mx.fast.rope`, on strided views, under
`mx.compile`, and bad arguments rejected at the boundary."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import pagekernels
from pagekernels import reference
from pagekernels.reference import NORM_ROPE_TOLERANCE

EPS = 1e-6
BASE = 1e6  # Qwen3's rope_theta
MAX_POSITION = 32767
DTYPES = [mx.float32, mx.float16, mx.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def _weight_and_offsets(D: int, B: int, L: int, dtype: mx.Dtype, rng: np.random.Generator):
    """A norm weight `[D]` around 1 and distinct nonzero offsets int32 `[B]`, the last token of
    row 0 at MAX_POSITION (where one ulp of a frequency would show)."""
    weight = mx.array(rng.uniform(0.5, 1.5, D).astype(np.float32)).astype(dtype)
    first = MAX_POSITION - L + 1
    others = rng.choice(np.arange(1, first), size=B - 1, replace=False) if B > 1 else []
    return weight, mx.array([first, *map(int, others)], dtype=mx.int32)


def _check(out: mx.array, x: mx.array, weight: mx.array, offsets: mx.array, assert_close):
    """Against the reference evaluated in float32 and rounded once (the kernels' own rounding:
    `TOLERANCE`) and against the reference in x's dtype (`NORM_ROPE_TOLERANCE`)."""
    kwargs = {"eps": EPS, "base": BASE}
    in_float32 = reference.norm_rope(
        x.astype(mx.float32), weight.astype(mx.float32), offsets, **kwargs
    )
    assert_close(out, in_float32.astype(x.dtype))
    in_dtype = reference.norm_rope(x, weight, offsets, **kwargs)
    assert_close(out, in_dtype, tol=NORM_ROPE_TOLERANCE[x.dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "shape",
    [
        (4, 1, 32, 128),  # decode, q of Qwen3-4B
        (4, 1, 8, 128),  # decode, k
        (2, 17, 8, 128),  # prefill, offsets different per row
        (3, 5, 4, 64),
        (2, 3, 2, 192),
        (1, 2, 3, 256),
    ],
    ids=str,
)
def test_matches_the_reference(device, poison_allocator, assert_close, dtype, shape):
    B, L, H, D = shape
    rng = np.random.default_rng(D + L)
    x = _random(rng, shape, dtype)
    weight, offsets = _weight_and_offsets(D, B, L, dtype, rng)
    mx.eval(x, weight, offsets)
    poison_allocator((B, H, L, D), dtype)
    out = pagekernels.norm_rope(x, weight, offsets, eps=EPS, base=BASE, stream=device)
    _check(out, x, weight, offsets, assert_close)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("view", ["q", "k", "unaligned", "transposed"])
def test_strided_views(device, poison_allocator, assert_close, dtype, view):
    """Views of a fused QKV projection `[B, L, (Hq + 2 Hkv) * D]` (column slices reshaped to
    heads), one starting an element into its buffer, and one with element stride H."""
    B, L, Hq, Hkv, D = 2, 3, 4, 2, 128
    rng = np.random.default_rng(11)
    qkv = _random(rng, (B, L, (Hq + 2 * Hkv) * D), dtype)
    if view == "q":
        x = qkv[:, :, : Hq * D].reshape(B, L, Hq, D)
    elif view == "k":
        x = qkv[:, :, Hq * D : (Hq + Hkv) * D].reshape(B, L, Hkv, D)
    elif view == "unaligned":
        x = qkv[:, :, 1 : 1 + Hq * D].reshape(B, L, Hq, D)
    else:
        x = _random(rng, (B, L, D, Hq), dtype).transpose(0, 1, 3, 2)
    weight, offsets = _weight_and_offsets(D, B, L, dtype, rng)
    mx.eval(qkv, x, weight, offsets)
    poison_allocator((B, x.shape[2], L, D), dtype)
    out = pagekernels.norm_rope(x, weight, offsets, eps=EPS, base=BASE, stream=device)
    _check(out, x, weight, offsets, assert_close)


@pytest.mark.parametrize("head_dim", [2, 6, 96])
def test_the_cpu_kernel_takes_any_even_head_dim(assert_close, head_dim):
    rng = np.random.default_rng(head_dim)
    x = _random(rng, (2, 4, 3, head_dim), mx.float32)
    weight, offsets = _weight_and_offsets(head_dim, 2, 4, mx.float32, rng)
    out = pagekernels.norm_rope(x, weight, offsets, eps=EPS, base=BASE, stream=mx.cpu)
    _check(out, x, weight, offsets, assert_close)


@pytest.mark.parametrize("head_dim", [32, 96])
def test_head_dims_the_gpu_kernel_lacks_take_mlx_ops_there(
    device, assert_close, tmp_path, head_dim
):
    """The CUDA kernel takes D % 64 == 0 up to 256; other even D run MLX's rms_norm and rope on
    a GPU stream (whose own rope frequencies differ in the last ulp, hence bfloat16 here)."""
    rng = np.random.default_rng(head_dim)
    x = _random(rng, (2, 4, 3, head_dim), mx.bfloat16)
    weight, offsets = _weight_and_offsets(head_dim, 2, 4, mx.bfloat16, rng)
    out = pagekernels.norm_rope(x, weight, offsets, eps=EPS, base=BASE, stream=device)
    graph = tmp_path / "graph.dot"
    mx.export_to_dot(str(graph), out)
    assert ("NormRope" in graph.read_text()) == (device == mx.cpu)
    expected = reference.norm_rope(x, weight, offsets, eps=EPS, base=BASE)
    assert_close(out, expected, tol=NORM_ROPE_TOLERANCE[mx.bfloat16])


def test_under_compile_attributes_stay_apart(device, assert_close):
    """A compiled step with two calls that differ only in `base` or `eps` keeps both (the
    primitive compares its attributes), and a second call with new values reuses the graph."""
    B, L, H, D = 2, 3, 4, 64

    @mx.compile
    def step(x, weight, offsets):
        def call(eps: float, base: float) -> mx.array:
            return pagekernels.norm_rope(x, weight, offsets, eps=eps, base=base, stream=device)

        return call(EPS, BASE), call(EPS, 1e4), call(0.5, BASE)

    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        x = _random(rng, (B, L, H, D), mx.float32)
        weight, offsets = _weight_and_offsets(D, B, L, mx.float32, rng)
        outs = step(x, weight, offsets)
        attributes = [(EPS, BASE), (EPS, 1e4), (0.5, BASE)]
        for out, (eps, base) in zip(outs, attributes, strict=True):
            assert_close(out, reference.norm_rope(x, weight, offsets, eps=eps, base=base))


def test_empty_batch_gives_an_empty_result(device):
    x = mx.zeros((0, 1, 4, 64), dtype=mx.bfloat16)
    weight = mx.ones((64,), dtype=mx.bfloat16)
    offsets = mx.zeros((0,), dtype=mx.int32)
    out = pagekernels.norm_rope(x, weight, offsets, eps=EPS, base=BASE, stream=device)
    assert out.shape == (0, 4, 1, 64) and out.dtype == mx.bfloat16


def _valid_args() -> dict:
    return {
        "x": mx.zeros((2, 3, 4, 64), dtype=mx.bfloat16),
        "weight": mx.ones((64,), dtype=mx.bfloat16),
        "offsets": mx.zeros((2,), dtype=mx.int32),
        "eps": EPS,
        "base": BASE,
    }


CASES = [
    pytest.param(
        {"x": mx.zeros((2, 3, 64), dtype=mx.bfloat16)},
        r"x must have rank 4 \[B, L, H, D\], got shape \(2, 3, 64\)",
        id="x-rank",
    ),
    pytest.param(
        {"x": mx.zeros((2, 3, 4, 64), dtype=mx.int32)},
        r"x must be float32, float16 or bfloat16, got int32",
        id="x-int",
    ),
    pytest.param(
        {"x": mx.zeros((2, 3, 4, 63), dtype=mx.bfloat16)},
        r"head dim D=x.shape\[3\]=63 must be even and positive",
        id="odd-head-dim",
    ),
    pytest.param(
        {"weight": mx.ones((1, 64), dtype=mx.bfloat16)},
        r"weight must have rank 1 \[D\], got shape \(1, 64\)",
        id="weight-rank",
    ),
    pytest.param(
        {"weight": mx.ones((32,), dtype=mx.bfloat16)},
        r"weight.shape\[0\]=32 must equal x.shape\[3\]=64",
        id="weight-size",
    ),
    pytest.param(
        {"weight": mx.ones((64,), dtype=mx.float32)},
        r"weight must have the dtype of x \(bfloat16\), got float32",
        id="weight-dtype",
    ),
    pytest.param(
        {"offsets": mx.zeros((2, 1), dtype=mx.int32)},
        r"offsets must have rank 1 \[B\], got shape \(2, 1\)",
        id="offsets-rank",
    ),
    pytest.param(
        {"offsets": mx.zeros((2,), dtype=mx.int64)},
        r"offsets must be int32, got int64",
        id="offsets-dtype",
    ),
    pytest.param(
        {"offsets": mx.zeros((3,), dtype=mx.int32)},
        r"offsets.shape\[0\]=3 must equal x.shape\[0\]=2",
        id="offsets-batch",
    ),
    pytest.param({"eps": 0.0}, r"eps must be a finite positive number, got 0", id="eps-zero"),
    pytest.param({"eps": math.nan}, r"eps must be a finite positive number, got nan", id="eps-nan"),
    pytest.param(
        {"base": -10.0}, r"base must be a finite positive number, got -10", id="base-negative"
    ),
    pytest.param(
        {"base": math.inf}, r"base must be a finite positive number, got inf", id="base-inf"
    ),
]


@pytest.mark.parametrize(("change", "match"), CASES)
def test_rejects(assert_rejected, change, match):
    assert_rejected("norm_rope", _valid_args() | change, match)
