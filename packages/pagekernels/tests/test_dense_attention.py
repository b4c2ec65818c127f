"""dense_attention against the readable reference and MLX SDPA."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import dense_attention, reference

# (B, Hq, Hkv, L, S, D, key_lens or None, causal, dtype)
CASES = [
    (2, 4, 4, 1, 37, 64, None, False, mx.float32),
    (2, 8, 2, 1, 300, 128, [300, 123], False, mx.bfloat16),
    (3, 8, 1, 9, 54, 96, [54, 9, 17], True, mx.float16),
    (2, 16, 2, 65, 97, 128, [97, 65], True, mx.float32),
    (1, 4, 2, 200, 260, 32, None, True, mx.bfloat16),
    (2, 8, 8, 2, 12, 64, [12, 5], True, mx.float32),
    (2, 16, 2, 8, 520, 128, None, True, mx.float16),
]
CASE_IDS = [
    f"B{c[0]}_gqa{c[1] // c[2]}_L{c[3]}_S{c[4]}_D{c[5]}_{'lens' if c[6] else 'full'}"
    f"_{'causal' if c[7] else 'nomask'}_{str(c[8]).split('.')[-1]}"
    for c in CASES
]


def _random(shape, dtype, rng):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


@pytest.mark.parametrize(
    ("B", "hq", "hkv", "L", "S", "D", "lens", "causal", "dtype"), CASES, ids=CASE_IDS
)
def test_matches_reference_and_sdpa(
    device, assert_close, poison_allocator, sdpa_oracle, B, hq, hkv, L, S, D, lens, causal, dtype
):
    rng = np.random.default_rng(S + L)
    queries = _random((B, hq, L, D), dtype, rng)
    keys = _random((B, hkv, S, D), dtype, rng)
    values = _random((B, hkv, S, D), dtype, rng)
    if lens is not None:  # poison every key past key_lens: reading one would show
        valid = mx.arange(S)[None, None, :, None] < mx.array(lens)[:, None, None, None]
        keys = mx.where(valid, keys, mx.nan)
        values = mx.where(valid, values, mx.nan)
    key_lens = None if lens is None else mx.array(lens, dtype=mx.int32)
    mask = "causal" if causal else None

    expected = reference.dense_attention(queries, keys, values, mask=mask, key_lens=key_lens)
    poison_allocator(queries.shape, dtype)
    out = dense_attention(queries, keys, values, mask=mask, key_lens=key_lens, stream=device)
    assert_close(out, expected)

    clean = lambda x: mx.where(mx.isnan(x), 0.0, x)  # noqa: E731  (SDPA multiplies 0 * NaN)
    sdpa = sdpa_oracle(
        queries, clean(keys), clean(values), lens or [S] * B, scale=D**-0.5, causal=causal
    )
    assert_close(out, sdpa)


def test_zero_key_lens_give_zeros(device, assert_close):
    rng = np.random.default_rng(5)
    queries = _random((2, 4, 1, 64), mx.float32, rng)
    keys = _random((2, 2, 16, 64), mx.float32, rng)
    values = _random((2, 2, 16, 64), mx.float32, rng)
    key_lens = mx.array([0, 16], dtype=mx.int32)
    out = dense_attention(queries, keys, values, key_lens=key_lens, stream=device)
    assert_close(out, reference.dense_attention(queries, keys, values, key_lens=key_lens))
    assert (np.array(out[0]) == 0).all() and np.abs(np.array(out[1])).max() > 0


def test_causal_aligns_to_key_lens(device, assert_close):
    """Row b's last query sees exactly its key_lens[b] keys, like decode at that context."""
    rng = np.random.default_rng(6)
    queries = _random((1, 2, 3, 64), mx.float32, rng)
    keys = _random((1, 2, 10, 64), mx.float32, rng)
    values = _random((1, 2, 10, 64), mx.float32, rng)
    out = dense_attention(
        queries, keys, values, mask="causal", key_lens=mx.array([7], dtype=mx.int32),
        stream=device,
    )  # fmt: skip
    for l in range(3):  # noqa: E741  (query position, as in the docs)
        visible = 7 - 3 + l + 1
        row = dense_attention(
            queries[:, :, l : l + 1], keys[:, :, :visible], values[:, :, :visible], stream=device
        )
        assert_close(out[:, :, l : l + 1], row, tol=1e-6)
