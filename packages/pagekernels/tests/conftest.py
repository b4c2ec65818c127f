"""Fixtures of the pagekernels tests: devices, the oracle tolerances, NaN-poisoned paged
inputs, the rejection check.

Helpers are handed out as fixtures (pytest runs in importlib mode, so test modules cannot import
each other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import pagekernels
from pagekernels.reference import TOLERANCE

POISON = float("nan")

# The GPU joins only where MLX has one (the H200 runs this same suite).
DEVICES = [mx.cpu] + ([mx.gpu] if mx.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _oracles_on_cpu():
    """Inputs and oracles (reference ops, MLX SDPA) run on the CPU; native ops name their stream.

    On the GPU machine the default device is the GPU, whose float32 matmul is not exact to 1e-5.
    """
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture(params=DEVICES, ids=lambda d: "gpu" if d == mx.gpu else "cpu")
def device(request: pytest.FixtureRequest) -> mx.Device:
    """The device the native op runs on; oracles always run on the CPU."""
    return request.param


def _assert_close(actual: mx.array, expected: mx.array, *, tol: float | None = None) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    tol = TOLERANCE[expected.dtype] if tol is None else tol
    a = np.array(actual.astype(mx.float32))
    e = np.array(expected.astype(mx.float32))
    assert np.isfinite(a).all(), "output holds NaN/inf (poisoned storage was read?)"
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol)


@pytest.fixture
def assert_close() -> Callable[..., None]:
    """`assert_close(actual, expected, *, tol=TOLERANCE[dtype])`: same shape, dtype, finite
    values within `tol` (absolute and relative; `pagekernels.reference.TOLERANCE` by default)."""
    return _assert_close


def _assert_rejected(op: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"^\[{op}\] " + match):
        getattr(pagekernels, op)(**kwargs)


@pytest.fixture
def assert_rejected() -> Callable[[str, dict[str, Any], str], None]:
    """`assert_rejected(op, kwargs, match)`: `pagekernels.<op>(**kwargs)` raises a ValueError
    whose message is `[op] ` followed by the regex `match`."""
    return _assert_rejected


def _poison_allocator(shape: Sequence[int], dtype: mx.Dtype) -> None:
    # MLX reuses freed buffers of the same size: a kernel that leaves part of its output
    # unwritten then shows NaN instead of stale zeros.
    poison = mx.full(shape, POISON, dtype=dtype)
    mx.eval(poison)
    del poison


@pytest.fixture
def poison_allocator() -> Callable[[Sequence[int], mx.Dtype], None]:
    """`poison_allocator(shape, dtype)`: leave a NaN-filled buffer of that size in MLX's cache."""
    return _poison_allocator


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PagedCase:
    """Random paged attention inputs; unused pages and tail slots hold NaN.

    Attributes:
        queries: `[B, Hq, L, D]`.
        key_pages: `[P, Hkv, page_size, D]`.
        value_pages: `[P, Hkv, page_size, D]`.
        block_table: int32 `[B, max_pages]`, -1 padded.
        context_lens: int32 `[B]`.
        page_size: Tokens per page.
        table: The block table as host lists.
        lens: The context lengths as a host list.
    """

    queries: mx.array
    key_pages: mx.array
    value_pages: mx.array
    block_table: mx.array
    context_lens: mx.array
    page_size: int
    table: list[list[int]]
    lens: list[int]

    def args(self) -> tuple:
        """Positional arguments of `paged_attention`."""
        return (
            self.queries,
            self.key_pages,
            self.value_pages,
            self.block_table,
            self.context_lens,
            self.page_size,
        )


def _make_paged(
    *,
    contexts: Sequence[int],
    num_q_heads: int,
    num_kv_heads: int,
    query_len: int,
    head_dim: int,
    page_size: int,
    dtype: mx.Dtype = mx.float32,
    spare_pages: int = 3,
    seed: int = 0,
) -> PagedCase:
    rng = np.random.default_rng(seed)
    needed = [-(-c // page_size) for c in contexts]
    num_pages = sum(needed) + spare_pages
    max_pages = max(needed, default=0) + 1  # always at least one -1 column
    page_ids = rng.permutation(num_pages).tolist()  # scattered, out of order
    shape = (num_pages, num_kv_heads, page_size, head_dim)
    key_pages = np.full(shape, POISON, dtype=np.float32)
    value_pages = np.full(shape, POISON, dtype=np.float32)
    table = []
    for context, n in zip(contexts, needed, strict=True):
        row = [page_ids.pop() for _ in range(n)]
        for t in range(context):
            page, slot = row[t // page_size], t % page_size
            key_pages[page, :, slot] = rng.standard_normal((num_kv_heads, head_dim))
            value_pages[page, :, slot] = rng.standard_normal((num_kv_heads, head_dim))
        table.append(row + [-1] * (max_pages - n))
    queries = rng.standard_normal((len(contexts), num_q_heads, query_len, head_dim))
    return PagedCase(
        queries=mx.array(queries.astype(np.float32)).astype(dtype),
        key_pages=mx.array(key_pages).astype(dtype),
        value_pages=mx.array(value_pages).astype(dtype),
        block_table=mx.array(table, dtype=mx.int32),
        context_lens=mx.array(list(contexts), dtype=mx.int32),
        page_size=page_size,
        table=table,
        lens=list(contexts),
    )


@pytest.fixture
def make_paged() -> Callable[..., PagedCase]:
    """`make_paged(*, contexts, num_q_heads, num_kv_heads, query_len, head_dim, page_size,
    dtype=float32, spare_pages=3, seed=0) -> PagedCase` with fresh random values."""
    return _make_paged


def _sdpa_oracle(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    key_lens: Sequence[int],
    *,
    scale: float,
    causal: bool,
    hidden: mx.array | None = None,
) -> mx.array:
    """MLX's SDPA on dense K/V `[B, Hkv, S, D]` with a boolean mask for key_lens (+ causal, and
    minus the keys where `hidden` `[B, S]` is True)."""
    B, _, L, _ = queries.shape
    S = keys.shape[2]
    lens = mx.array(list(key_lens))[:, None, None, None]
    key_pos = mx.arange(S)[None, None, None, :]
    visible = key_pos < lens
    if causal:
        visible = visible & (key_pos <= mx.arange(L)[None, None, :, None] + lens - L)
    if hidden is not None:
        visible = visible & ~hidden[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=visible, stream=mx.cpu
    )


@pytest.fixture
def sdpa_oracle() -> Callable[..., mx.array]:
    """`sdpa_oracle(q, k, v, key_lens, *, scale, causal, hidden=None)`: MLX SDPA (tests only),
    rows that see at least one key."""
    return _sdpa_oracle
