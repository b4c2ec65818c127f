"""paged_attention against the readable reference and MLX SDPA on gathered K/V."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagekernels import dense_attention, paged_attention, reference

# (contexts, Hq, Hkv, L, D, page_size, causal, dtype): each axis covered, not their product.
# Contexts cross page boundaries and end mid-page; L=8 is the last decode-schedule length.
CASES = [
    ([5, 17, 1], 4, 4, 1, 64, 1, False, mx.float32),
    ([9, 2, 14], 4, 2, 2, 128, 4, True, mx.bfloat16),
    ([40, 8, 100], 8, 2, 8, 128, 16, True, mx.float16),
    ([9, 70], 8, 1, 9, 96, 32, True, mx.float32),
    ([65, 300], 8, 2, 65, 64, 128, True, mx.bfloat16),
    ([200, 261], 4, 2, 200, 32, 16, True, mx.float32),
    ([20, 9, 33], 4, 1, 9, 64, 4, False, mx.float16),
    ([700, 513], 16, 2, 1, 128, 16, False, mx.bfloat16),  # large enough to use threads
    ([1030, 31], 8, 8, 3, 128, 32, True, mx.float32),
]
CASE_IDS = [
    f"ctx{'-'.join(map(str, c[0]))}_gqa{c[1] // c[2]}_L{c[3]}_D{c[4]}_ps{c[5]}"
    f"_{'causal' if c[6] else 'full'}_{str(c[7]).split('.')[-1]}"
    for c in CASES
]


@pytest.mark.parametrize(
    ("contexts", "hq", "hkv", "L", "D", "page_size", "causal", "dtype"), CASES, ids=CASE_IDS
)
def test_matches_reference_and_sdpa(
    device, make_paged, assert_close, poison_allocator, sdpa_oracle,
    contexts, hq, hkv, L, D, page_size, causal, dtype,
):  # fmt: skip
    case = make_paged(
        contexts=contexts, num_q_heads=hq, num_kv_heads=hkv, query_len=L, head_dim=D,
        page_size=page_size, dtype=dtype, seed=len(CASE_IDS) * L + D,
    )  # fmt: skip
    mask = "causal" if causal else None
    expected = reference.paged_attention(*case.args(), mask=mask)
    poison_allocator(case.queries.shape, dtype)
    out = paged_attention(*case.args(), mask=mask, stream=device)
    assert_close(out, expected)

    keys, values = reference.gather_kv(
        case.key_pages, case.value_pages, case.block_table, case.context_lens, page_size
    )
    sdpa = sdpa_oracle(case.queries, keys, values, contexts, scale=D**-0.5, causal=causal)
    assert_close(out, sdpa)


# (contexts, Hq, Hkv, L, D, page_size, dtype): the decode schedule, 128-row prefill tiles (on
# the H200 the wgmma kernel: L * G > 64, D = 128, 16-bit; at page 128 a whole key tile hidden)
# and the float32 kernels.
HOLE_CASES = [
    ([300, 700], 8, 2, 1, 128, 16, mx.bfloat16),
    ([300, 700], 32, 8, 40, 128, 16, mx.bfloat16),
    ([300, 700], 32, 8, 40, 128, 128, mx.float16),
    ([300, 700], 4, 2, 9, 64, 16, mx.float32),
]


@pytest.mark.parametrize(
    ("contexts", "hq", "hkv", "L", "D", "page_size", "dtype"),
    HOLE_CASES,
    ids=[f"L{c[3]}_ps{c[5]}_{str(c[6]).split('.')[-1]}" for c in HOLE_CASES],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unmapped_pages_inside_the_context_are_not_seen(
    device, make_paged, assert_close, poison_allocator, sdpa_oracle,
    contexts, hq, hkv, L, D, page_size, dtype, causal,
):  # fmt: skip
    """A block-table entry inside a context that is -1 or past the storage (out of contract)
    hides that page's keys in every kernel; MLX SDPA with those keys masked is the oracle."""
    case = make_paged(
        contexts=contexts, num_q_heads=hq, num_kv_heads=hkv, query_len=L, head_dim=D,
        page_size=page_size, dtype=dtype, seed=L + page_size,
    )  # fmt: skip
    holes = {(0, 1): -1, (1, 3): case.key_pages.shape[0] + 5}  # (row, logical page): entry
    table = [list(row) for row in case.table]
    hidden = np.zeros((len(contexts), len(table[0]) * page_size), dtype=bool)
    for (row, page), entry in holes.items():
        table[row][page] = entry
        hidden[row, page * page_size : (page + 1) * page_size] = True
    holed = dataclasses.replace(case, block_table=mx.array(table, dtype=mx.int32), table=table)
    mask = "causal" if causal else None
    poison_allocator(case.queries.shape, dtype)
    out = paged_attention(*holed.args(), mask=mask, stream=device)
    assert_close(out, reference.paged_attention(*holed.args(), mask=mask))

    keys, values = reference.gather_kv(*case.args()[1:])
    sdpa = sdpa_oracle(
        case.queries, keys, values, contexts, scale=D**-0.5, causal=causal,
        hidden=mx.array(hidden),
    )  # fmt: skip
    assert_close(out, sdpa)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_rows_give_zeros(device, make_paged, assert_close, poison_allocator, causal):
    case = make_paged(
        contexts=[0, 33, 0, 4], num_q_heads=4, num_kv_heads=2, query_len=4, head_dim=128,
        page_size=16,
    )  # fmt: skip
    mask = "causal" if causal else None
    poison_allocator(case.queries.shape, mx.float32)
    out = paged_attention(*case.args(), mask=mask, stream=device)
    assert_close(out, reference.paged_attention(*case.args(), mask=mask))
    out_np = np.array(out)
    assert (out_np[[0, 2]] == 0).all()
    assert (np.abs(out_np[[1, 3]]).max(axis=-1) > 0).all()


@pytest.mark.parametrize("D", [1, 33, 250], ids=lambda d: f"D{d}")
def test_any_head_dim_on_cpu(make_paged, assert_close, D):
    """The CPU kernels take any D (the GPU kernels: multiples of 8 up to 256)."""
    case = make_paged(
        contexts=[21, 9], num_q_heads=4, num_kv_heads=2, query_len=3, head_dim=D, page_size=4,
        dtype=mx.bfloat16,
    )  # fmt: skip
    out = paged_attention(*case.args(), mask="causal", stream=mx.cpu)
    assert_close(out, reference.paged_attention(*case.args(), mask="causal"))


def test_scale_is_applied(device, make_paged, assert_close):
    case = make_paged(
        contexts=[37, 12], num_q_heads=4, num_kv_heads=2, query_len=1, head_dim=64, page_size=8
    )
    out = paged_attention(*case.args(), scale=0.37, stream=device)
    assert_close(out, reference.paged_attention(*case.args(), scale=0.37))
    default = paged_attention(*case.args(), stream=device)
    assert not np.allclose(np.array(out), np.array(default), atol=1e-3)


def test_same_kernel_as_dense_attention(device, make_paged, assert_close):
    """Paged addressing and dense addressing share the online-softmax kernel: identical math."""
    case = make_paged(
        contexts=[50, 23], num_q_heads=8, num_kv_heads=2, query_len=5, head_dim=128, page_size=8
    )
    keys, values = reference.gather_kv(
        case.key_pages, case.value_pages, case.block_table, case.context_lens, case.page_size
    )
    paged = paged_attention(*case.args(), mask="causal", stream=device)
    dense = dense_attention(
        case.queries, keys, values, mask="causal", key_lens=case.context_lens, stream=device
    )
    assert_close(paged, dense, tol=1e-6)


def test_strided_inputs_are_read_correctly(device, make_paged, assert_close):
    """Non-row-contiguous views (a transposed query, a slice of wider pages) are accepted."""
    case = make_paged(
        contexts=[19, 6], num_q_heads=4, num_kv_heads=2, query_len=3, head_dim=64, page_size=8
    )
    queries_blhd = case.queries.transpose(0, 2, 1, 3)  # as a projection would produce it
    queries = queries_blhd.transpose(0, 2, 1, 3)
    wide_keys = mx.concatenate([case.key_pages, case.key_pages], axis=2)[:, :, : case.page_size]
    out = paged_attention(
        queries, wide_keys, case.value_pages, case.block_table, case.context_lens,
        case.page_size, mask="causal", stream=device,
    )  # fmt: skip
    assert_close(out, reference.paged_attention(*case.args(), mask="causal"))


def test_works_under_compile(device, make_paged, assert_close):
    case = make_paged(
        contexts=[30, 3], num_q_heads=4, num_kv_heads=4, query_len=3, head_dim=64, page_size=4
    )

    @mx.compile
    def twice(*args):
        a = paged_attention(*args, case.page_size, mask="causal", stream=device)
        b = paged_attention(*args, case.page_size, mask="causal", stream=device)
        return a + b

    out = twice(*case.args()[:-1])
    assert_close(out, 2 * reference.paged_attention(*case.args(), mask="causal"))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_shapes_match_reference(device, make_paged, assert_close, data):
    """Fresh random shapes, page layouts, masks and dtypes on both schedules."""
    query_len = data.draw(st.sampled_from([1, 2, 5, 8, 9, 17, 40]), label="L")
    contexts = data.draw(
        st.lists(st.just(0) | st.integers(query_len, query_len + 300), min_size=1, max_size=3),
        label="contexts",
    )
    hkv = data.draw(st.sampled_from([1, 2]), label="Hkv")
    case = make_paged(
        contexts=contexts,
        num_q_heads=hkv * data.draw(st.sampled_from([1, 2, 4, 8]), label="G"),
        num_kv_heads=hkv,
        query_len=query_len,
        head_dim=data.draw(st.sampled_from([32, 64, 80, 128]), label="D"),
        page_size=data.draw(st.sampled_from([1, 2, 4, 16, 32, 128]), label="page_size"),
        dtype=data.draw(st.sampled_from([mx.float32, mx.float16, mx.bfloat16]), label="dtype"),
        seed=data.draw(st.integers(0, 2**32 - 1), label="seed"),
    )
    mask = data.draw(st.sampled_from([None, "causal"]), label="mask")
    out = paged_attention(*case.args(), mask=mask, stream=device)
    assert_close(out, reference.paged_attention(*case.args(), mask=mask))
