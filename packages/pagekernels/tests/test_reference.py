"""The readable equations never read array values on the host: each runs inside `mx.compile`
(which refuses any evaluation during tracing), so the `reference` backend costs no device sync
per layer and compiled model steps can use it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import get_backend, reference


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_write_kv_under_compile_matches_numpy(dtype):
    P, hkv, page_size, D = 5, 2, 4, 16
    rng = np.random.default_rng(7)

    def random(shape: tuple[int, ...]) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    def host(x: mx.array) -> np.ndarray:
        return np.array(x.astype(mx.float32))

    pages = [random((P, hkv, page_size, D)) for _ in range(2)]
    slots = [9, -1, 0, P * page_size, 19, -7, 6, P * page_size + 5]  # negative, beyond: skipped
    new = [random((len(slots), hkv, D)) for _ in range(2)]
    before = [host(x) for x in pages]

    compiled = mx.compile(reference.write_kv)(*pages, *new, mx.array(slots, dtype=mx.int32))

    for out, old, rows in zip(compiled, before, new, strict=True):
        expected = old.copy()
        for t, slot in enumerate(slots):
            if 0 <= slot < P * page_size:
                expected[slot // page_size, :, slot % page_size] = host(rows[t])
        assert out.shape == (P, hkv, page_size, D) and out.dtype == dtype
        np.testing.assert_array_equal(host(out), expected)
    for x, old in zip(pages, before, strict=True):  # functional: the inputs keep their values
        np.testing.assert_array_equal(host(x), old)


def test_attention_and_gather_under_compile(make_paged, assert_close):
    case = make_paged(
        contexts=[13, 0, 6], num_q_heads=4, num_kv_heads=2, query_len=3, head_dim=32, page_size=4
    )
    tables = (case.block_table, case.context_lens)
    keys, values = reference.gather_kv(case.key_pages, case.value_pages, *tables, 4)

    @mx.compile
    def step(queries, key_pages, value_pages, block_table, context_lens):
        k, v = reference.gather_kv(key_pages, value_pages, block_table, context_lens, 4)
        paged = reference.paged_attention(
            queries, key_pages, value_pages, block_table, context_lens, 4, mask="causal"
        )
        dense = reference.dense_attention(queries, k, v, mask="causal", key_lens=context_lens)
        return k, v, paged, dense

    k, v, paged, dense = step(*case.args()[:-1])
    assert_close(k, keys, tol=0.0)
    assert_close(v, values, tol=0.0)
    expected = reference.paged_attention(*case.args(), mask="causal")
    assert_close(paged, expected)
    assert_close(dense, expected)


def test_quantized_embedding_under_compile(assert_close):
    table = mx.array(np.random.default_rng(3).standard_normal((11, 64)).astype(np.float32))
    weight, scales, biases = mx.quantize(table, group_size=32, bits=4)
    indices = mx.array([[4, -1, 10], [11, 0, 4]], dtype=mx.int32)  # -1 and 11: zero rows

    embed = mx.compile(lambda i: reference.quantized_embedding(
        i, weight, scales, biases, group_size=32, bits=4
    ))  # fmt: skip
    out = embed(indices)

    dequantized = np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=4))
    expected = np.zeros((2, 3, 64), dtype=np.float32)
    for (b, i), index in np.ndenumerate(np.array(indices)):
        if 0 <= index < 11:
            expected[b, i] = dequantized[index]
    assert_close(out, mx.array(expected))


def test_norm_rope_under_compile(assert_close):
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((2, 3, 4, 64)).astype(np.float32))
    weight = mx.array(rng.uniform(0.5, 1.5, 64).astype(np.float32))
    offsets = mx.array([7, 90], dtype=mx.int32)  # float32 angles near 90 are good to ~1e-5

    compiled = mx.compile(lambda x, o: reference.norm_rope(x, weight, o, eps=1e-6, base=1e4))
    out = compiled(x, offsets)

    # The equation in numpy: RMSNorm, then pairs (i, i + 32) rotated by (offset + l) * 1e4^(-i/32).
    xs = np.array(x, dtype=np.float64)
    normed = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-6) * np.array(weight)
    angles = (np.array(offsets)[:, None] + np.arange(3))[..., None, None] * 1e4 ** (
        -np.arange(32) / 32
    )  # [B, L, 1, 32]
    x1, x2 = normed[..., :32], normed[..., 32:]
    cos, sin = np.cos(angles), np.sin(angles)
    expected = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
    assert_close(out, mx.array(expected.transpose(0, 2, 1, 3).astype(np.float32)), tol=1e-4)


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda ops: ops.dense_attention(
                mx.zeros((1, 2, 1, 64)),
                mx.zeros((1, 2, 3, 64)),
                mx.zeros((1, 2, 3, 64)),
                mask="full",
            ),
            'mask must be None or "causal", got .full.',
        ),
        (
            lambda ops: ops.split_linear(mx.zeros((1, 4)), mx.zeros((10, 4)), [4, 4]),
            r"widths must be .*non-negative output widths summing to weight.shape\[0\]=10",
        ),
    ],
    ids=["unknown-mask", "widths-short-of-n"],
)
def test_both_backends_reject_what_would_compute_something_else(backend, call, match):
    """Inputs the reference would otherwise take silently (a mask read as none, a split into
    other parts) are errors there too, as in the kernels."""
    with pytest.raises(ValueError, match=match):
        call(get_backend(backend))
