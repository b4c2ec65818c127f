"""paged_attention on the CUDA GPU against the CPU-stream reference and MLX SDPA.

The design brief's section 8 matrix (contexts across page boundaries up to 32768, page sizes
1..128, decode lengths 1..8 and prefill lengths 9..511, batch 1/3/64, all dtypes, NaN-poisoned
free pages and tail slots), forced split-K counts, the tensor-core vs CUDA-core decode, and the
sign of the scale. The tests exist only where MLX has a CUDA GPU: on a CPU-only machine this
module defines none (nothing to skip; the CPU kernels have their own tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import _ext, paged_attention, reference

GPU = mx.cuda.is_available()
pytestmark = pytest.mark.gpu


def gpu_test(test: Callable) -> Callable | None:
    """Keeps `test` only on machines with a CUDA GPU (pytest collects no `None` attribute)."""
    return test if GPU else None


@contextlib.contextmanager
def tuning(**knobs: int | bool | str) -> Iterator[None]:
    """Sets the CUDA kernel knobs of csrc/cuda/tuning.h (`_ext.set_<name>`) inside the block."""
    saved = {name: getattr(_ext, name)() for name in knobs}
    try:
        for name, value in knobs.items():
            getattr(_ext, f"set_{name}")(value)
        yield
    finally:
        for name, value in saved.items():
            getattr(_ext, f"set_{name}")(value)


def cpu_reference(case, *, mask: str | None, scale: float | None = None) -> mx.array:
    """The readable mlx.core equation, evaluated on the CPU stream."""
    with mx.stream(mx.cpu):
        out = reference.paged_attention(*case.args(), scale=scale, mask=mask)
        mx.eval(out)
    return out


def run_gpu(case, *, mask: str | None, scale: float | None = None) -> mx.array:
    out = paged_attention(*case.args(), scale=scale, mask=mask, stream=mx.gpu)
    mx.eval(out)
    return out


_BATCH64 = np.random.default_rng(64).integers(1, 600, size=64).tolist()

# (contexts, Hq, Hkv, L, D, page_size, causal, dtype). Each axis is covered, not the product.
# D = 64/128 with 16-bit dtypes run on tensor cores; float32 and D = 96/256 on CUDA cores.
MATRIX = [
    # decode schedule, L = 1..8
    ([1, 15, 16], 8, 2, 1, 128, 16, False, mx.bfloat16),
    ([17, 127, 128, 129], 32, 8, 1, 128, 16, True, mx.bfloat16),
    ([4097], 32, 8, 1, 128, 128, False, mx.bfloat16),
    ([32768], 32, 8, 1, 128, 16, True, mx.bfloat16),
    ([129, 4097, 15], 8, 1, 2, 128, 1, True, mx.float16),
    ([15, 16, 17], 4, 4, 3, 64, 64, True, mx.float32),
    ([127, 128, 129], 16, 2, 4, 96, 16, True, mx.bfloat16),
    ([4097, 8], 8, 2, 5, 128, 64, True, mx.float16),
    ([200, 33, 129], 12, 4, 6, 64, 16, True, mx.bfloat16),
    ([300, 17], 8, 2, 7, 256, 16, True, mx.float32),
    ([1000, 130, 8], 8, 8, 8, 128, 16, True, mx.bfloat16),
    ([16, 4097], 4, 1, 8, 64, 128, False, mx.float16),
    (_BATCH64, 32, 8, 1, 128, 16, True, mx.bfloat16),
    (_BATCH64, 8, 2, 1, 128, 16, False, mx.float32),
    # prefill schedule, L > 8
    ([9, 40, 129], 8, 2, 9, 128, 16, True, mx.bfloat16),
    ([17, 100, 4097], 32, 8, 17, 128, 16, True, mx.bfloat16),
    ([64, 200], 8, 2, 64, 64, 1, True, mx.float16),
    ([511, 600], 4, 1, 511, 128, 128, True, mx.bfloat16),
    ([511], 8, 8, 511, 128, 64, True, mx.float32),
    ([100, 70], 6, 2, 64, 96, 16, False, mx.bfloat16),
    ([4097], 8, 2, 64, 128, 16, False, mx.bfloat16),
    ([17, 33, 64], 4, 2, 17, 64, 64, False, mx.float32),
    # enough row blocks for the 128-row tensor-core tiles (>= 4 per SM on the H200)
    ([600, 700, 650, 1000], 32, 8, 600, 128, 16, True, mx.bfloat16),
    ([600, 601, 602, 900], 32, 8, 600, 64, 64, False, mx.float16),
    # the 128-row wgmma tiles with query groups other than 4 (rows = L * G split across heads)
    ([300, 257, 100], 12, 4, 100, 128, 16, True, mx.bfloat16),
    ([260, 129], 10, 2, 70, 128, 128, True, mx.float16),
    ([400, 130], 8, 8, 130, 128, 16, True, mx.bfloat16),
]
MATRIX_IDS = [
    f"B{len(c[0])}_ctx{max(c[0])}_gqa{c[1] // c[2]}_L{c[3]}_D{c[4]}_ps{c[5]}"
    f"_{'causal' if c[6] else 'full'}_{str(c[7]).split('.')[-1]}"
    for c in MATRIX
]
FIELDS = ("contexts", "hq", "hkv", "L", "D", "page_size", "causal", "dtype")


@gpu_test
@pytest.mark.parametrize(FIELDS, MATRIX, ids=MATRIX_IDS)
def test_matches_cpu_reference_and_sdpa(
    make_paged, assert_close, poison_allocator, sdpa_oracle,
    contexts, hq, hkv, L, D, page_size, causal, dtype,
):  # fmt: skip
    case = make_paged(
        contexts=contexts, num_q_heads=hq, num_kv_heads=hkv, query_len=L, head_dim=D,
        page_size=page_size, dtype=dtype, seed=L * 1000 + D + page_size,
    )  # fmt: skip
    mask = "causal" if causal else None
    expected = cpu_reference(case, mask=mask)
    poison_allocator(case.queries.shape, dtype)
    out = run_gpu(case, mask=mask)
    assert_close(out, expected)

    with mx.stream(mx.cpu):
        keys, values = reference.gather_kv(
            case.key_pages, case.value_pages, case.block_table, case.context_lens, page_size
        )
    sdpa = sdpa_oracle(case.queries, keys, values, contexts, scale=D**-0.5, causal=causal)
    assert_close(out, sdpa)


# (contexts, Hq, Hkv, L, D, page_size, dtype), all causal.
SPLIT_CASES = [
    ([4097, 1000, 15], 8, 2, 1, 128, 16, mx.bfloat16),
    ([4097, 1000, 15], 8, 2, 4, 128, 64, mx.float16),
    ([2000, 700], 8, 2, 3, 96, 16, mx.bfloat16),
    ([2000, 700], 4, 4, 1, 128, 1, mx.float32),
    ([3000, 64], 8, 2, 2, 64, 16, mx.float16),
    ([4097, 600], 8, 2, 64, 128, 16, mx.bfloat16),
    ([1500, 80], 4, 2, 33, 64, 32, mx.float32),
]


@gpu_test
@pytest.mark.parametrize(
    ("contexts", "hq", "hkv", "L", "D", "page_size", "dtype"),
    SPLIT_CASES,
    ids=[f"L{c[3]}_D{c[4]}_ps{c[5]}_{str(c[6]).split('.')[-1]}" for c in SPLIT_CASES],
)
def test_forced_split_counts_agree(
    make_paged, assert_close, poison_allocator, contexts, hq, hkv, L, D, page_size, dtype
):
    case = make_paged(
        contexts=contexts, num_q_heads=hq, num_kv_heads=hkv, query_len=L, head_dim=D,
        page_size=page_size, dtype=dtype, seed=7,
    )  # fmt: skip
    expected = cpu_reference(case, mask="causal")
    knob = "decode_num_splits" if L <= 8 else "prefill_num_splits"
    unsplit = None
    for splits in (1, 2, 3, 4, 7, 16, 64):
        poison_allocator(case.queries.shape, dtype)
        with tuning(**{knob: splits}):
            out = run_gpu(case, mask="causal")
        assert_close(out, expected)
        if unsplit is None:
            unsplit = out
        else:
            assert_close(out, unsplit)


@gpu_test
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("L", [1, 3, 8])
def test_cuda_core_decode_matches_tensor_core_decode(make_paged, assert_close, dtype, D, L):
    case = make_paged(
        contexts=[L, 300, 4097], num_q_heads=32, num_kv_heads=8, query_len=L, head_dim=D,
        page_size=16, dtype=dtype, seed=L,
    )  # fmt: skip
    expected = cpu_reference(case, mask="causal")
    tensor_cores = run_gpu(case, mask="causal")
    with tuning(decode_tensor_cores=False):
        cuda_cores = run_gpu(case, mask="causal")
    assert_close(tensor_cores, expected)
    assert_close(cuda_cores, expected)


@gpu_test
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("contexts", "L", "page_size", "causal"),
    [
        ([17, 900], 17, 16, True),
        ([40, 41, 3000], 40, 1, True),
        ([600, 1100], 600, 128, True),
        ([0, 1100, 0, 600], 600, 16, True),
        ([300, 129], 100, 16, False),
        ([700, 300], 300, 8, True),
        ([1000, 333], 333, 24, True),
        ([1100, 650], 600, 64, True),
    ],
    ids=[
        "L17_ps16_causal",
        "L40_ps1_causal",
        "L600_ps128_causal",
        "L600_ps16_empty_requests",
        "L100_ps16_full",
        "L300_ps8_causal",
        "L333_ps24_causal",
        "L600_ps64_causal",
    ],
)
def test_prefill128_kernels_match_reference(
    make_paged, assert_close, poison_allocator, dtype, contexts, L, page_size, causal
):
    """128-row prefill tiles at D = 128: the Hopper wgmma kernel and the mma.sync kernel match the
    reference (L * G = 68 .. 2400 rows: tiles whose second warpgroup is partly or wholly empty;
    304 and 608 work items, several per CTA of the persistent wgmma kernel, and requests without
    keys, whose items have no tile and whose rows are zero). Pages of 8, 16, 24, 64 and 128 keys
    give the wgmma kernel's TMA copies boxes of 8, 16, 8, 32 and 32 rows (page 1: none), next
    to the cp.async copies of the rows a box cannot take (NaN-poisoned tails of last pages)."""
    case = make_paged(
        contexts=contexts, num_q_heads=32, num_kv_heads=8, query_len=L, head_dim=128,
        page_size=page_size, dtype=dtype, seed=L,
    )  # fmt: skip
    mask = "causal" if causal else None
    expected = cpu_reference(case, mask=mask)
    empty = [b for b, n in enumerate(contexts) if n == 0]
    for kernel in ("wgmma", "mma_sync"):
        poison_allocator(case.queries.shape, dtype)
        with tuning(prefill_kernel=kernel):
            out = run_gpu(case, mask=mask)
        assert_close(out, expected)
        assert (np.array(out.astype(mx.float32))[empty] == 0).all()


@gpu_test
@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.25])
@pytest.mark.parametrize("L", [1, 33])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=["bfloat16", "float32"])
def test_any_finite_scale(make_paged, assert_close, scale, L, dtype):
    """The tensor-core path folds the sign of the scale into Q; zero means uniform weights."""
    case = make_paged(
        contexts=[L + 40, 300], num_q_heads=8, num_kv_heads=2, query_len=L, head_dim=128,
        page_size=16, dtype=dtype, seed=3,
    )  # fmt: skip
    out = run_gpu(case, mask="causal", scale=scale)
    assert_close(out, cpu_reference(case, mask="causal", scale=scale))


@gpu_test
@pytest.mark.parametrize("slope", [1e-3, 1e-2, 2e-2], ids=["growth_6", "growth_60", "growth_120"])
@pytest.mark.parametrize(
    ("L", "prefill_kernel"), [(600, "wgmma"), (600, "mma_sync"), (1, "wgmma")],
    ids=["prefill_wgmma", "prefill_mma_sync", "decode"],
)  # fmt: skip
def test_growing_scores_move_the_running_max(
    make_paged, assert_close, poison_allocator, slope, L, prefill_kernel
):
    """Scores that grow along the keys: every key t carries t * slope of a direction u that
    every query leans towards, so a row's max grows by about 6, 60 or 120 in the exp2 domain per
    128-key tile and the online softmax rescales a row's outputs on most tiles, by factors down
    to 2^-120, where random keys stop moving the max after a row's first tiles. In the wgmma
    kernel's lazy max, growth 6 moves the max (a thread's sum passes 2^8), 60 moves it or
    recomputes S, and 120 recomputes S on most tiles (some exponentials overflow); random
    inputs elsewhere take its path without a max."""
    case = make_paged(
        contexts=[L + 1500, 900], num_q_heads=32, num_kv_heads=8, query_len=L, head_dim=128,
        page_size=16, dtype=mx.bfloat16, seed=11,
    )  # fmt: skip
    u = np.random.default_rng(12).standard_normal(128).astype(np.float32)
    keys = np.array(case.key_pages.astype(mx.float32))
    for row, n in zip(case.table, case.lens, strict=True):
        for t in range(n):
            keys[row[t // case.page_size], :, t % case.page_size] += t * slope * u
    queries = np.array(case.queries.astype(mx.float32)) + 3 * u
    case = dataclasses.replace(
        case,
        queries=mx.array(queries).astype(mx.bfloat16),
        key_pages=mx.array(keys).astype(mx.bfloat16),
    )
    expected = cpu_reference(case, mask="causal")
    poison_allocator(case.queries.shape, mx.bfloat16)
    with tuning(prefill_kernel=prefill_kernel):
        out = run_gpu(case, mask="causal")
    assert_close(out, expected)


@gpu_test
@pytest.mark.parametrize("splits", [1, 5])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32], ids=["bfloat16", "float32"])
def test_empty_rows_are_zero_through_the_merge(
    make_paged, assert_close, poison_allocator, splits, dtype
):
    case = make_paged(
        contexts=[0, 1300, 0, 5], num_q_heads=8, num_kv_heads=2, query_len=1, head_dim=128,
        page_size=16, dtype=dtype,
    )  # fmt: skip
    poison_allocator(case.queries.shape, dtype)
    with tuning(decode_num_splits=splits):
        out = run_gpu(case, mask=None)
    assert_close(out, cpu_reference(case, mask=None))
    out_np = np.array(out.astype(mx.float32))
    assert (out_np[[0, 2]] == 0).all()
    assert (np.abs(out_np[[1, 3]]).max(axis=-1) > 0).all()


@gpu_test
@pytest.mark.parametrize("L", [1, 20])
def test_new_metadata_values_with_the_same_shapes(make_paged, assert_close, L):
    """Graph replays with new context lengths read them afresh (no plan baked from values)."""
    case = make_paged(
        contexts=[900, 300], num_q_heads=8, num_kv_heads=2, query_len=L, head_dim=128,
        page_size=16, dtype=mx.bfloat16, seed=11,
    )  # fmt: skip
    for lens in ([900, 300], [L, 299], [500, L + 1], [900, 300]):
        step = type(case)(
            queries=case.queries, key_pages=case.key_pages, value_pages=case.value_pages,
            block_table=case.block_table, context_lens=mx.array(lens, dtype=mx.int32),
            page_size=case.page_size, table=case.table, lens=lens,
        )  # fmt: skip
        assert_close(run_gpu(step, mask="causal"), cpu_reference(step, mask="causal"))


@gpu_test
def test_tuning_knobs_validate_and_restore():
    with pytest.raises(ValueError, match="split count"):
        _ext.set_decode_num_splits(-1)
    with pytest.raises(ValueError, match="expected one of auto, mma_sync, wgmma"):
        _ext.set_prefill_kernel("flash")
    knobs = {"decode_num_splits": 3, "prefill_num_splits": 2, "decode_tensor_cores": False,
             "prefill_kernel": "mma_sync"}  # fmt: skip
    with tuning(**knobs):
        assert {name: getattr(_ext, name)() for name in knobs} == knobs
    assert _ext.decode_num_splits() == 0
    assert _ext.prefill_num_splits() == 0
    assert _ext.decode_tensor_cores() is True
    assert _ext.prefill_kernel() == "auto"
