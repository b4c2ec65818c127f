"""write_kv (in place, O(T)) and gather_kv (dense copies) against the reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import gather_kv, paged_attention, reference, write_kv


def _random(shape, dtype, rng):
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def _host(x: mx.array) -> np.ndarray:
    """A float32 numpy copy, taken now (before any later in-place write)."""
    return np.array(x.astype(mx.float32))


@pytest.mark.parametrize(
    ("P", "hkv", "page_size", "D", "T", "dtype"),
    [
        (6, 2, 4, 64, 9, mx.float32),
        (5, 1, 16, 128, 17, mx.bfloat16),
        (9, 4, 1, 96, 6, mx.float16),
        (3, 2, 128, 32, 130, mx.float32),
    ],
    ids=["ps4-f32", "ps16-bf16", "ps1-f16", "ps128-f32"],
)
def test_writes_slots_in_place(device, assert_close, P, hkv, page_size, D, T, dtype):
    rng = np.random.default_rng(P * T)
    key_pages = _random((P, hkv, page_size, D), dtype, rng)
    value_pages = _random((P, hkv, page_size, D), dtype, rng)
    mx.eval(key_pages, value_pages)
    keys_before, values_before = _host(key_pages), _host(value_pages)
    keys = _random((T, hkv, D), dtype, rng)
    values = _random((T, hkv, D), dtype, rng)
    slots = rng.permutation(P * page_size)[:T].tolist()
    slots[1] = -1  # padding token: skipped
    slots[-1] = P * page_size + 3  # beyond storage: skipped, never written
    slot_mapping = mx.array(slots, dtype=mx.int32)

    expected_keys, expected_values = reference.write_kv(
        key_pages, value_pages, keys, values, slot_mapping
    )
    mx.eval(expected_keys, expected_values)  # before the in-place write below
    new_keys, new_values = write_kv(
        key_pages, value_pages, keys, values, slot_mapping, stream=device
    )
    assert_close(new_keys, expected_keys, tol=0.0)
    assert_close(new_values, expected_values, tol=0.0)

    # Untouched slots keep their random values; skipped tokens left no trace.
    written = {s for s in slots if 0 <= s < P * page_size}
    untouched = [s for s in range(P * page_size) if s not in written]
    pages, offsets = np.divmod(np.array(untouched), page_size)
    got = _host(new_keys)[pages, :, offsets]
    np.testing.assert_array_equal(got, keys_before[pages, :, offsets])
    got = _host(new_values)[pages, :, offsets]
    np.testing.assert_array_equal(got, values_before[pages, :, offsets])

    # In place: the caller's page arrays share the buffers and show the new tokens too.
    assert_close(key_pages, expected_keys, tol=0.0)
    assert_close(value_pages, expected_values, tol=0.0)


def test_no_tokens_returns_the_pages(device):
    key_pages = mx.random.normal((2, 1, 4, 8))
    value_pages = mx.random.normal((2, 1, 4, 8))
    empty = mx.zeros((0, 1, 8))
    new_keys, new_values = write_kv(
        key_pages, value_pages, empty, empty, mx.zeros((0,), dtype=mx.int32), stream=device
    )
    np.testing.assert_array_equal(np.array(new_keys), np.array(key_pages))
    np.testing.assert_array_equal(np.array(new_values), np.array(value_pages))


def test_strided_pages_still_get_the_write(device, assert_close):
    """A strided pool view is copied first: the result holds the write, the view does not."""
    rng = np.random.default_rng(1)
    wide = _random((3, 2, 8, 16), mx.float32, rng)
    key_pages = wide[:, :, :4]  # not row-contiguous
    value_pages = _random((3, 2, 4, 16), mx.float32, rng)
    keys = _random((2, 2, 16), mx.float32, rng)
    slot_mapping = mx.array([5, 10], dtype=mx.int32)
    expected = reference.write_kv(key_pages, value_pages, keys, keys, slot_mapping)
    new_keys, new_values = write_kv(key_pages, value_pages, keys, keys, slot_mapping, stream=device)
    assert_close(new_keys, expected[0], tol=0.0)
    assert_close(new_values, expected[1], tol=0.0)


def test_feeds_paged_attention(device, make_paged, assert_close):
    """Decode step as the model runs it: write the new token, then attend to the result."""
    case = make_paged(
        contexts=[12, 30], num_q_heads=4, num_kv_heads=2, query_len=1, head_dim=64, page_size=8
    )
    lens = [13, 31]  # one new token per row, written at position context_len
    slots = mx.array([case.table[b][t // 8] * 8 + t % 8 for b, t in enumerate([12, 30])])
    slots = slots.astype(mx.int32)
    new = _random((2, 2, 64), mx.float32, np.random.default_rng(2))
    context_lens = mx.array(lens, dtype=mx.int32)
    rk, rv = reference.write_kv(case.key_pages, case.value_pages, new, new, slots)
    expected = reference.paged_attention(case.queries, rk, rv, case.block_table, context_lens, 8)
    mx.eval(expected)  # before the in-place write below

    k2, v2 = write_kv(case.key_pages, case.value_pages, new, new, slots, stream=device)
    out = paged_attention(case.queries, k2, v2, case.block_table, context_lens, 8, stream=device)
    assert_close(out, expected)


@pytest.mark.parametrize(
    ("contexts", "page_size", "dtype"),
    [([5, 0, 17], 1, mx.float32), ([33, 16], 16, mx.bfloat16), ([7, 130], 128, mx.float16),
     ([9, 1, 4], 4, mx.float32)],
    ids=["ps1-f32-empty-row", "ps16-bf16", "ps128-f16", "ps4-f32"],
)  # fmt: skip
def test_gather_matches_reference(
    device, make_paged, assert_close, poison_allocator, contexts, page_size, dtype
):
    case = make_paged(
        contexts=contexts, num_q_heads=2, num_kv_heads=2, query_len=1, head_dim=32,
        page_size=page_size, dtype=dtype,
    )  # fmt: skip
    args = (case.key_pages, case.value_pages, case.block_table, case.context_lens, page_size)
    expected_keys, expected_values = reference.gather_kv(*args)
    poison_allocator(expected_keys.shape, dtype)
    keys, values = gather_kv(*args, stream=device)
    assert_close(keys, expected_keys, tol=0.0)
    assert_close(values, expected_values, tol=0.0)
    for b, context in enumerate(contexts):  # exact zeros past each row's context
        assert (_host(keys[b, :, context:]) == 0).all()
        assert (_host(values[b, :, context:]) == 0).all()


def test_gather_reads_strided_pages_and_broadcast_lengths(device, make_paged, assert_close):
    """Inputs that are not row-major (a transposed pool, context lengths broadcast from one
    value) give what their row-major copies give."""
    case = make_paged(
        contexts=[20, 20], num_q_heads=2, num_kv_heads=2, query_len=1, head_dim=32, page_size=8
    )
    pool_t = mx.contiguous(case.key_pages.transpose(0, 2, 1, 3))  # [P, ps, Hkv, D] in memory
    key_pages = pool_t.transpose(0, 2, 1, 3)  # [P, Hkv, ps, D] view, not row-major
    context_lens = mx.broadcast_to(mx.array([20], dtype=mx.int32), (2,))  # stride 0
    mx.eval(pool_t, context_lens)
    args = (key_pages, case.value_pages, case.block_table, context_lens, 8)
    expected = reference.gather_kv(mx.contiguous(key_pages), *args[1:])
    for got, wanted in zip(gather_kv(*args, stream=device), expected, strict=True):
        assert_close(got, wanted, tol=0.0)
