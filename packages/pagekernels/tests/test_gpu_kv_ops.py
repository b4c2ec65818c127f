"""write_kv, gather_kv, dense_attention and quantized_embedding on the CUDA GPU against the same
ops on the CPU stream (bit-exact where the op only moves or dequantizes bits) and the readable
reference. Defined only where MLX has a CUDA GPU, like test_gpu_paged_attention.py.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import dense_attention, gather_kv, quantized_embedding, reference, write_kv

GPU = mx.cuda.is_available()
pytestmark = pytest.mark.gpu


def gpu_test(test: Callable) -> Callable | None:
    """Keeps `test` only on machines with a CUDA GPU (pytest collects no `None` attribute)."""
    return test if GPU else None


def same_bits(a: mx.array, b: mx.array) -> None:
    """Equal shape, dtype and values, NaN matching NaN (untouched poisoned storage)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    np.testing.assert_array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))


def poisoned_pool(rng, shape) -> np.ndarray:
    """A page pool of random rows with a NaN page and NaN slots scattered in."""
    pool = rng.standard_normal(shape).astype(np.float32)
    pool[0] = np.nan
    pool[:, :, ::5] = np.nan
    return pool


# (Hkv, page_size, D, dtype): 16-byte rows take the vector path, D = 6 / 5 the element path.
ROW_CASES = [
    (2, 16, 128, mx.bfloat16),
    (8, 1, 64, mx.float16),
    (1, 64, 128, mx.float32),
    (2, 4, 6, mx.float16),
    (3, 8, 5, mx.float32),
]
ROW_IDS = [f"hkv{c[0]}_ps{c[1]}_D{c[2]}_{str(c[3]).split('.')[-1]}" for c in ROW_CASES]


@gpu_test
@pytest.mark.parametrize(("hkv", "page_size", "D", "dtype"), ROW_CASES, ids=ROW_IDS)
def test_write_kv_matches_cpu_in_place(hkv, page_size, D, dtype):
    rng = np.random.default_rng(D)
    P = 7
    pools = [poisoned_pool(rng, (P, hkv, page_size, D)) for _ in range(2)]
    slots = rng.permutation(P * page_size)[:9].tolist() + [-1, P * page_size, P * page_size + 3]
    T = len(slots)
    keys = mx.array(rng.standard_normal((T, hkv, D)).astype(np.float32)).astype(dtype)
    values = mx.array(rng.standard_normal((T, hkv, D)).astype(np.float32)).astype(dtype)
    slot_mapping = mx.array(slots, dtype=mx.int32)

    def fresh_pages() -> tuple[mx.array, mx.array]:  # each run writes into its own storage
        pages = tuple(mx.array(pool).astype(dtype) for pool in pools)
        mx.eval(pages)
        return pages

    with mx.stream(mx.cpu):
        want_k, want_v = reference.write_kv(*fresh_pages(), keys, values, slot_mapping)
        cpu_k, cpu_v = write_kv(*fresh_pages(), keys, values, slot_mapping)
        mx.eval(want_k, want_v, cpu_k, cpu_v)
    k_pages, v_pages = fresh_pages()
    gpu_k, gpu_v = write_kv(k_pages, v_pages, keys, values, slot_mapping, stream=mx.gpu)
    mx.eval(gpu_k, gpu_v)
    for got, cpu, want in ((gpu_k, cpu_k, want_k), (gpu_v, cpu_v, want_v)):
        same_bits(got, want)
        same_bits(got, cpu)
    same_bits(k_pages, gpu_k)  # written in place: the input pages are the output


@gpu_test
@pytest.mark.parametrize(("hkv", "page_size", "D", "dtype"), ROW_CASES, ids=ROW_IDS)
def test_gather_kv_matches_cpu(hkv, page_size, D, dtype):
    rng = np.random.default_rng(D + 1)
    P = 20
    shape = (P, hkv, page_size, D)
    k_pages = mx.array(poisoned_pool(rng, shape)).astype(dtype)
    v_pages = mx.array(poisoned_pool(rng, shape)).astype(dtype)
    ids = rng.permutation(np.arange(1, P)).tolist()  # page 0 (all NaN) stays unused
    table = [ids[:3] + [-1, -1], ids[3:8], [-1] * 5, ids[8:9] + [-1] * 4]
    lens = [3 * page_size - 1, 5 * page_size, 0, 1]
    block_table = mx.array(table, dtype=mx.int32)
    context_lens = mx.array(lens, dtype=mx.int32)
    args = (k_pages, v_pages, block_table, context_lens, page_size)

    with mx.stream(mx.cpu):
        want = reference.gather_kv(*args)
        cpu = gather_kv(*args)
        mx.eval(want, cpu)
    got = gather_kv(*args, stream=mx.gpu)
    for g, c, w in zip(got, cpu, want, strict=True):
        same_bits(g, c)
        same_bits(g, w)  # the reference zeroes rows past the context and of -1 pages


# (S, key_lens, Hq, Hkv, L, D, causal, dtype); keys past key_lens hold NaN.
DENSE_CASES = [
    (300, [300, 17, 0], 8, 2, 1, 128, True, mx.bfloat16),
    (300, [300, 17, 5], 8, 2, 5, 64, False, mx.float32),
    (700, [700, 64, 650], 8, 2, 64, 128, True, mx.float16),
    (129, [129, 100, 80], 4, 4, 77, 96, True, mx.float32),
]


@gpu_test
@pytest.mark.parametrize(
    ("S", "key_lens", "hq", "hkv", "L", "D", "causal", "dtype"),
    DENSE_CASES,
    ids=[f"S{c[0]}_L{c[4]}_D{c[5]}_{str(c[7]).split('.')[-1]}" for c in DENSE_CASES],
)
def test_dense_attention_matches_reference(
    assert_close, poison_allocator, S, key_lens, hq, hkv, L, D, causal, dtype
):
    rng = np.random.default_rng(S + L)
    B = len(key_lens)
    keys = rng.standard_normal((B, hkv, S, D)).astype(np.float32)
    values = rng.standard_normal((B, hkv, S, D)).astype(np.float32)
    for b, n in enumerate(key_lens):
        keys[b, :, n:] = np.nan
        values[b, :, n:] = np.nan
    queries = mx.array(rng.standard_normal((B, hq, L, D)).astype(np.float32)).astype(dtype)
    keys, values = mx.array(keys).astype(dtype), mx.array(values).astype(dtype)
    lens = mx.array(key_lens, dtype=mx.int32)
    mask = "causal" if causal else None
    with mx.stream(mx.cpu):
        expected = reference.dense_attention(queries, keys, values, mask=mask, key_lens=lens)
        mx.eval(expected)
    poison_allocator(queries.shape, dtype)
    out = dense_attention(queries, keys, values, mask=mask, key_lens=lens, stream=mx.gpu)
    assert_close(out, expected)


@gpu_test
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_quantized_embedding_matches_cpu(assert_close, bits, group_size, dtype):
    V, dims = 50, 256
    with mx.stream(mx.cpu):
        table = mx.random.normal((V, dims), key=mx.random.key(bits * group_size)).astype(dtype)
        weight, scales, biases = mx.quantize(table, group_size=group_size, bits=bits)
        mx.eval(weight, scales, biases)
    indices = mx.array([[3, 49, 0], [-1, 50, 7]], dtype=mx.int32)
    args = (indices, weight, scales, biases)
    with mx.stream(mx.cpu):
        cpu = quantized_embedding(*args, group_size=group_size, bits=bits)
        want = reference.quantized_embedding(*args, group_size=group_size, bits=bits)
        mx.eval(cpu, want)
    got = quantized_embedding(*args, group_size=group_size, bits=bits, stream=mx.gpu)
    same_bits(got, cpu)
    assert_close(got, want)
    assert (np.array(got.astype(mx.float32))[1, :2] == 0).all()
