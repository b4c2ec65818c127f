"""The dense "Week 2" baseline without pages: per-request contiguous K/V caches, repacked into
one padded dense batch every step and run through `dense_attention`.

The model sees no request ids. A row is identified by the first page id of its block-table
row (the engine still allocates pages for admission); a row whose first new position is 0
starts a fresh cache. This holds because a page has one owner: the baseline rejects batches
that share a first page (forks, prefix sharing), which it cannot represent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx

from pagepool import BatchMetadata, PageCopy, PagePool
from qwen3model.attention import attend_dense

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["DenseKVStore", "DenseStepAttention"]

# Contiguous caches grow by this many positions at a time (as mlx-lm's KVCache does).
GROWTH_STEP = 256


class _RequestCache:
    """One request's K/V: per layer a `[Hkv, capacity, D]` array, filled up to `length`."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: mx.Dtype, fill_value: float
    ) -> None:
        self.shape = (num_kv_heads, 0, head_dim)
        self.dtype = dtype
        self.fill_value = fill_value
        self.keys = [mx.zeros(self.shape, dtype) for _ in range(num_layers)]
        self.values = [mx.zeros(self.shape, dtype) for _ in range(num_layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values)

    def reserve(self, length: int) -> None:
        """Grows every layer's arrays to hold `length` positions (copying the old ones)."""
        if length <= self.capacity:
            return
        extra = -(-(length - self.capacity) // GROWTH_STEP) * GROWTH_STEP
        Hkv, _, D = self.shape
        padding = mx.full((Hkv, extra, D), self.fill_value, self.dtype)
        self.keys = [mx.concatenate([k, padding], axis=1) for k in self.keys]
        self.values = [mx.concatenate([v, padding], axis=1) for v in self.values]

    def write(self, layer: int, start: int, keys: mx.array, values: mx.array) -> None:
        """Stores `keys`/`values` `[Hkv, L, D]` at positions `start .. start + L - 1`."""
        stop = start + keys.shape[1]
        self.keys[layer][:, start:stop, :] = keys
        self.values[layer][:, start:stop, :] = values

    def read(self, layer: int, length: int) -> tuple[mx.array, mx.array]:
        """Returns the layer's first `length` positions, each `[Hkv, length, D]`."""
        return self.keys[layer][:, :length, :], self.values[layer][:, :length, :]


class DenseKVStore:
    """K/V of the dense baseline: contiguous per-request caches instead of pages (a
    `pageruntime.KVStore`; the engine's pages only identify rows). `nbytes` reports the caches.

    Args:
        pool: The engine's page pool (its page ids identify rows).
        num_layers: Layers.
        num_kv_heads: `Hkv`.
        head_dim: `D`.
        dtype: Cache dtype.
        fill_value: Value of the cache positions nothing has written yet.

    Attributes:
        peak_nbytes: Largest total size of the live caches seen at the start of a step.
    """

    def __init__(
        self,
        pool: PagePool,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: mx.Dtype,
        fill_value: float = 0.0,
    ) -> None:
        if min(num_layers, num_kv_heads, head_dim) < 1:
            raise ValueError(
                f"num_layers, num_kv_heads and head_dim must be >= 1, got {num_layers}, "
                f"{num_kv_heads} and {head_dim}"
            )
        self._pool = pool
        self._dtype = dtype
        self._shape = (num_layers, num_kv_heads, head_dim)
        self._fill_value = fill_value
        self._caches: dict[int, _RequestCache] = {}
        self.peak_nbytes = 0

    def __repr__(self) -> str:
        num_layers, num_kv_heads, head_dim = self._shape
        return (
            f"DenseKVStore(num_layers={num_layers}, num_kv_heads={num_kv_heads}, "
            f"head_dim={head_dim}, dtype={self._dtype}, requests={len(self._caches)})"
        )

    @property
    def pool(self) -> PagePool:
        """The engine's page pool; a row's first page id names its cache."""
        return self._pool

    @property
    def dtype(self) -> mx.Dtype:
        """Cache dtype."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """Bytes held by the live per-request caches."""
        return sum(cache.nbytes for cache in self._caches.values())

    @property
    def num_requests(self) -> int:
        """Requests with a live cache."""
        return len(self._caches)

    def empty_row(self, length: int) -> mx.array:
        """Zeros `[Hkv, length, D]` in the cache dtype: a padding row of the dense batch."""
        _, Hkv, D = self._shape
        return mx.zeros((Hkv, length, D), self.dtype)

    def step_arrays(self) -> list[mx.array]:
        """Every live cache array (to evaluate the step's writes together with its logits)."""
        return [a for cache in self._caches.values() for a in cache.keys + cache.values]

    def copy_pages(self, copies: Sequence[PageCopy]) -> None:
        """Copy-on-write copies come from shared pages, which the baseline rejects at the step
        (`begin_step`); a copy here would be a page it cannot represent.

        Raises:
            ValueError: Any copy.
        """
        if copies:
            raise ValueError(
                f"the dense baseline keeps no pages to copy, got {len(copies)} copy-on-write "
                "copies (shared pages: forks or prefix sharing)"
            )

    def snapshot(self) -> None:
        """Nothing to take: after a failed step its requests fail, free their pages, and their
        caches are dropped at the next `begin_step`."""

    def restore(self, snapshot: None) -> None:
        """See `snapshot`."""

    def begin_step(self, metadata: BatchMetadata) -> list[_RequestCache | None]:
        """Finds (or starts) every row's cache and reserves room for its new tokens.

        Returns:
            One cache per row, None for padding rows.

        Raises:
            ValueError: A row continues a request whose cache is unknown or out of step, or
                two rows share a first page.
        """
        pages = metadata.block_table_host
        L = metadata.query_len
        self._evict_released(pages)
        rows: list[_RequestCache | None] = []
        firsts: set[int] = set()
        for b, context_len in enumerate(metadata.context_lens_host):
            if context_len == 0:
                rows.append(None)
                continue
            first, start = pages[b][0], context_len - L
            if first in firsts:
                raise ValueError(f"row {b} shares first page {first} with another row")
            firsts.add(first)
            if start == 0:
                self._caches[first] = _RequestCache(*self._shape, self.dtype, self._fill_value)
            cache = self._caches.get(first)
            if cache is None or cache.length != start:
                have = None if cache is None else cache.length
                raise ValueError(
                    f"row {b} (first page {first}) continues at position {start}, but the dense "
                    f"cache holds {have} positions; the baseline cannot follow this request"
                )
            cache.reserve(context_len)
            cache.length = context_len
            rows.append(cache)
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return rows

    def _evict_released(self, pages: tuple[tuple[int, ...], ...]) -> None:
        # A cache dies when its first page is free, or was handed to another request.
        reused = {page_id for row in pages for page_id in row[1:] if page_id >= 0}
        for first in list(self._caches):
            if first in reused or self.pool.refcount(first) == 0:
                del self._caches[first]


class DenseStepAttention:
    """Writes K/V into each row's contiguous cache, repacks the rows into a padded dense batch
    `[B, Hkv, S, D]` (S = longest context) and runs `dense_attention` with `key_lens`.

    The step's longest context, each row's padding and the filler of padding rows are worked
    out once, when the step starts, and shared by every layer.

    Attributes:
        copied_bytes: K and V bytes repacked this step (counted from shapes).
    """

    def __init__(
        self,
        backend: KernelBackend,
        store: DenseKVStore,
        metadata: BatchMetadata,
        scale: float,
    ) -> None:
        self.backend = backend
        self.metadata = metadata
        self.scale = scale
        self.rows = store.begin_step(metadata)
        self.copied_bytes = 0
        lengths = metadata.context_lens_host
        longest = max(lengths)
        self._paddings = [[(0, 0), (0, longest - n), (0, 0)] for n in lengths]
        self._filler = store.empty_row(longest) if None in self.rows else None

    def __call__(self, layer: int, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        """See `StepAttention`."""
        L = keys.shape[2]
        lengths = self.metadata.context_lens_host
        batch_keys, batch_values = [], []
        for b, cache in enumerate(self.rows):
            if cache is None:
                batch_keys.append(self._filler)
                batch_values.append(self._filler)
                continue
            cache.write(layer, lengths[b] - L, keys[b], values[b])
            row_keys, row_values = cache.read(layer, lengths[b])
            batch_keys.append(mx.pad(row_keys, self._paddings[b]))
            batch_values.append(mx.pad(row_values, self._paddings[b]))
        dense_keys, dense_values = mx.stack(batch_keys), mx.stack(batch_values)
        self.copied_bytes += dense_keys.nbytes + dense_values.nbytes
        return attend_dense(
            self.backend,
            queries,
            dense_keys,
            dense_values,
            key_lens=self.metadata.context_lens,
            scale=self.scale,
        )
