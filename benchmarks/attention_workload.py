"""The attention benchmark's workload: shapes with their byte/FLOP floors, inputs, paths, gate.

One `Shape` is one cell of the grid (decode L = 1 or causal prefill L = context). Inputs are a
shared K/V page pool whose page ids are shuffled (rows never own contiguous pages), with free
pages and unused tail slots poisoned with NaN so a kernel that reads them fails the gate. The
paths are the seed's three: the dense control (gather + our dense attention), the direct paged
kernel, and MLX's SDPA on the already gathered tensor; plus the gather alone (`write_kv` is in
`write_workload`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from pagepool import BatchMetadata

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = [
    "ATTENTION_PATHS",
    "TOLERANCE",
    "PagedInputs",
    "Shape",
    "attention_call",
    "bytes_moved",
    "check_gate",
    "derive_copy",
    "make_paged_inputs",
    "sdpa_inputs",
]

ATTENTION_PATHS = ("dense", "paged", "sdpa")
TOLERANCE = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 2e-2}
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """One benchmark cell: a decode (query_len 1) or causal prefill (query_len = context) shape.

    Every row of the batch has the same context, as in the seed's operator benchmark.
    """

    batch: int
    context: int
    page_size: int
    query_len: int = 1
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("batch", "context", "page_size", "query_len", "heads_q", "heads_kv"):
            if getattr(self, name) < 1:
                raise ValueError(f"Shape.{name}={getattr(self, name)} must be >= 1")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}"
            )
        if self.query_len > self.context:
            raise ValueError(f"query_len={self.query_len} exceeds context={self.context}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; expected one of {sorted(DTYPES)}")

    @property
    def op(self) -> str:
        return "decode" if self.query_len == 1 else "prefill"

    @property
    def mask(self) -> str | None:
        return None if self.query_len == 1 else "causal"

    @property
    def mx_dtype(self) -> mx.Dtype:
        return DTYPES[self.dtype]

    @property
    def pages_per_row(self) -> int:
        return math.ceil(self.context / self.page_size)

    @property
    def kv_bytes(self) -> int:
        """K + V bytes the attention kernel must read: every cached token once per KV head."""
        item = self.mx_dtype.size
        return 2 * self.batch * self.context * self.heads_kv * self.head_dim * item

    @property
    def gather_bytes(self) -> int:
        """Bytes the dense control's gather moves: K+V read from pages plus the dense copy."""
        padded = self.pages_per_row * self.page_size
        return self.kv_bytes + 2 * self.batch * padded * self.heads_kv * self.head_dim * (
            self.mx_dtype.size
        )

    @property
    def qo_bytes(self) -> int:
        """Queries read plus outputs written (small next to K/V for decode)."""
        return 2 * self.batch * self.heads_q * self.query_len * self.head_dim * self.mx_dtype.size

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of QK^T and PV over the visible keys (causal prefill halves them)."""
        visible = sum(self.context - self.query_len + 1 + t for t in range(self.query_len))
        return 4 * self.batch * self.heads_q * self.head_dim * visible

    @property
    def write_bytes(self) -> int:
        """`write_kv` for one step of this shape: B*L new K/V rows read, then written to pages."""
        rows = self.batch * self.query_len * self.heads_kv * self.head_dim * self.mx_dtype.size
        return 2 * 2 * rows

    def label(self) -> str:
        return (
            f"{self.op} B={self.batch} ctx={self.context} ps={self.page_size} "
            f"L={self.query_len} {self.dtype}"
        )

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)


def bytes_moved(path: str, shape: Shape, *, pool_bytes: int) -> dict[str, int]:
    """The bytes a path must move through memory: its bandwidth figures' numerators.

    Args:
        path: "paged", "sdpa", "dense", "gather", "write" or "write_functional".
        shape: The cell.
        pool_bytes: K + V pool bytes (the functional write copies all of them).

    Returns:
        `kv_bytes` (K/V the attention reads), `gather_bytes` (the gather's read + write),
        `total_bytes` (dense: both), `write_bytes` (rows read + written), `pool_copy_bytes`.
    """
    kv, gather = shape.kv_bytes, shape.gather_bytes
    table = {
        "paged": {"kv_bytes": kv},
        "sdpa": {"kv_bytes": kv},
        "dense": {"kv_bytes": kv, "gather_bytes": gather, "total_bytes": kv + gather},
        "gather": {"gather_bytes": gather},
        "write": {"write_bytes": shape.write_bytes},
        "write_functional": {"write_bytes": shape.write_bytes, "pool_copy_bytes": 2 * pool_bytes},
    }
    if path not in table:
        raise ValueError(f"unknown path {path!r}; expected one of {sorted(table)}")
    return table[path]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PagedInputs:
    """One copy of a cell's inputs.

    Attributes:
        queries: [B, Hq, L, D], the shape's dtype.
        key_pages: [P, Hkv, ps, D]; pages no row uses and slots past the context hold NaN.
        value_pages: [P, Hkv, ps, D], poisoned like key_pages.
        block_table: int32 [B, pages_per_row], shuffled physical page ids.
        context_lens: int32 [B], all equal to the shape's context.

    block_table and context_lens come from `BatchMetadata`, so they sit in memory as the
    runtime's do (views of one array; `benchmarks/metadata_placement.py` shows why it matters).
    """

    queries: mx.array
    key_pages: mx.array
    value_pages: mx.array
    block_table: mx.array
    context_lens: mx.array


def _page_layout(shape: Shape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled block table [B, pages_per_row] and a [P, ps] mask of slots holding live tokens."""
    rng = np.random.default_rng(seed)
    live = shape.batch * shape.pages_per_row
    num_pages = live + max(1, live // 8)  # spare pages, poisoned, interleaved with live ones
    page_ids = rng.permutation(num_pages)[:live].astype(np.int32)
    block_table = page_ids.reshape(shape.batch, shape.pages_per_row)
    valid = np.zeros((num_pages, shape.page_size), dtype=bool)
    positions = np.arange(shape.pages_per_row * shape.page_size).reshape(shape.pages_per_row, -1)
    for row in block_table:
        valid[row] = positions < shape.context
    return block_table, valid


def make_paged_inputs(shape: Shape, *, seed: int) -> PagedInputs:
    """Builds a pool of fresh random K/V (N(0, 1)) behind a shuffled block table.

    Args:
        shape: The cell.
        seed: Seeds the page shuffle and all values.

    Returns:
        Evaluated inputs.
    """
    block_table, valid = _page_layout(shape, seed)
    keep = mx.array(valid)[:, None, :, None]
    q_key, k_key, v_key = mx.random.split(mx.random.key(seed), 3)
    queries = mx.random.normal(
        (shape.batch, shape.heads_q, shape.query_len, shape.head_dim), key=q_key
    ).astype(shape.mx_dtype)
    pool_shape = (valid.shape[0], shape.heads_kv, shape.page_size, shape.head_dim)
    nan = mx.array(float("nan"), dtype=shape.mx_dtype)
    key_pages, value_pages = (
        mx.where(keep, mx.random.normal(pool_shape, key=k).astype(shape.mx_dtype), nan)
        for k in (k_key, v_key)
    )
    metadata = BatchMetadata.from_host(
        block_table.tolist(),
        [shape.context] * shape.batch,
        query_len=shape.query_len,
        page_size=shape.page_size,
        num_pages=valid.shape[0],
    )
    inputs = PagedInputs(
        queries=queries,
        key_pages=key_pages,
        value_pages=value_pages,
        block_table=metadata.block_table,
        context_lens=metadata.context_lens,
    )
    mx.eval(
        inputs.queries,
        inputs.key_pages,
        inputs.value_pages,
        inputs.block_table,
        inputs.context_lens,
    )
    return inputs


def derive_copy(inputs: PagedInputs, copy: int) -> PagedInputs:
    """Another pool in its own buffers: `inputs`' values scaled per head dim (NaNs stay NaN).

    Cheaper than drawing fresh normals (the timer may need hundreds of copies); the gate runs on
    the freshly drawn original.
    """
    D = inputs.key_pages.shape[-1]
    dtype = inputs.key_pages.dtype
    scale = mx.random.uniform(0.5, 1.5, (D,), key=mx.random.key(copy)).astype(dtype)
    key_pages, value_pages = inputs.key_pages * scale, inputs.value_pages * scale
    mx.eval(key_pages, value_pages)
    return PagedInputs(
        queries=inputs.queries,
        key_pages=key_pages,
        value_pages=value_pages,
        block_table=inputs.block_table,
        context_lens=inputs.context_lens,
    )


def sdpa_inputs(backend: KernelBackend, inputs: PagedInputs, shape: Shape) -> tuple[mx.array, ...]:
    """(queries, keys, values) for MLX SDPA: the pages gathered once, cut to the context.

    Returns:
        queries [B, Hq, L, D]; keys and values [B, Hkv, context, D], contiguous and evaluated.
    """
    keys, values = backend.gather_kv(
        inputs.key_pages,
        inputs.value_pages,
        inputs.block_table,
        inputs.context_lens,
        shape.page_size,
    )
    keys = mx.contiguous(keys[:, :, : shape.context])
    values = mx.contiguous(values[:, :, : shape.context])
    mx.eval(keys, values)
    return inputs.queries, keys, values


def attention_call(
    path: str, backend: KernelBackend, shape: Shape
) -> Callable[..., mx.array | tuple[mx.array, mx.array]]:
    """The lazy computation one timed call of `path` performs.

    Args:
        path: "paged", "dense" (gather + dense attention), "gather" (the gather alone) or
            "sdpa" (MLX SDPA on pre-gathered K/V; its argument is `sdpa_inputs`' tuple).
        backend: The pagekernels backend that provides the paged/dense/gather ops.
        shape: The cell.

    Returns:
        A function of one input copy returning the lazy output(s).
    """
    scale = shape.head_dim**-0.5

    def paged(x: PagedInputs) -> mx.array:
        return backend.paged_attention(
            x.queries,
            x.key_pages,
            x.value_pages,
            x.block_table,
            x.context_lens,
            shape.page_size,
            scale=scale,
            mask=shape.mask,
        )

    def gather(x: PagedInputs) -> tuple[mx.array, mx.array]:
        return backend.gather_kv(
            x.key_pages, x.value_pages, x.block_table, x.context_lens, shape.page_size
        )

    def dense(x: PagedInputs) -> mx.array:
        keys, values = gather(x)
        return backend.dense_attention(
            x.queries, keys, values, scale=scale, mask=shape.mask, key_lens=x.context_lens
        )

    def sdpa(x: tuple[mx.array, mx.array, mx.array]) -> mx.array:
        queries, keys, values = x
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=shape.mask
        )

    calls = {"paged": paged, "dense": dense, "gather": gather, "sdpa": sdpa}
    if path not in calls:
        raise ValueError(f"unknown attention path {path!r}; expected one of {sorted(calls)}")
    return calls[path]


def check_gate(out: mx.array, expected: mx.array, dtype: str) -> dict[str, float | bool]:
    """Compares a path's output with the readable reference at the dtype's tolerance.

    Returns:
        {"ok", "max_abs_err", "max_rel_err" (|err| / max|expected|), "tolerance"}; NaN fails.
    """
    tol = TOLERANCE[dtype]
    out32, exp32 = out.astype(mx.float32), expected.astype(mx.float32)
    err = mx.abs(out32 - exp32)
    max_err = float(mx.max(err).item())
    ref_max = float(mx.max(mx.abs(exp32)).item())
    ok = out.shape == expected.shape and bool(mx.allclose(out32, exp32, rtol=tol, atol=tol).item())
    return {
        "ok": ok and math.isfinite(max_err),
        "max_abs_err": max_err,
        "max_rel_err": max_err / ref_max if ref_max else max_err,
        "tolerance": tol,
    }
