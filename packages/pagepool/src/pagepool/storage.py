"""`KVStorage`: one contiguous K and one V page array per layer, grown with the pool.

A kernel turns a page id into an address in these arrays (`[P, H_kv, page_size, D]`). Writes
happen in place in the `write_kv` kernel (another package), which costs O(new tokens); the
model hands the arrays it returns back through `update_layer`. Copy-on-write copies are lazy
indexed updates (see `copy_pages` for their cost).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import mlx.core as mx

from pagepool._validate import as_int
from pagepool.errors import InvalidArgument, InvalidPageId
from pagepool.pool import PageCopy, PagePool

__all__ = ["SUPPORTED_DTYPES", "KVStorage"]

SUPPORTED_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
"""Element types a `KVStorage` accepts."""


class KVStorage:
    """Per-layer K/V page arrays indexed by the pool's page ids.

    Registers itself as a growth listener of `pool`: when the pool grows, every array is
    enlarged (old pages copied, new pages set to `fill_value`) and the copied bytes are
    reported to the pool's metrics.

    Args:
        pool: The pool whose page ids index the arrays.
        num_layers: Layers, >= 1.
        num_kv_heads: `H_kv`, >= 1.
        head_dim: `D`, >= 1.
        dtype: `mx.float32`, `mx.float16` or `mx.bfloat16`.
        fill_value: Initial value of every slot, a real number (not a bool); tests poison
            storage with NaN.

    Example:
        >>> storage = KVStorage(PagePool(4, 8), num_layers=2, num_kv_heads=1, head_dim=8,
        ...                     dtype=mx.float16)
        >>> storage.keys[0].shape
        (8, 1, 4, 8)
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
        if not isinstance(pool, PagePool):
            raise InvalidArgument(f"pool must be a PagePool, got {type(pool).__name__}")
        num_layers = as_int(num_layers, "num_layers", minimum=1)
        self._num_kv_heads = as_int(num_kv_heads, "num_kv_heads", minimum=1)
        self._head_dim = as_int(head_dim, "head_dim", minimum=1)
        if dtype not in SUPPORTED_DTYPES:
            raise InvalidArgument(f"dtype must be one of float32, float16, bfloat16, got {dtype!r}")
        if isinstance(fill_value, bool) or not isinstance(fill_value, numbers.Real):
            raise InvalidArgument(f"fill_value must be a float, got {fill_value!r}")
        self._pool = pool
        self._dtype = dtype
        self._fill_value = float(fill_value)
        self._keys = [self._filled(pool.capacity) for _ in range(num_layers)]
        self._values = [self._filled(pool.capacity) for _ in range(num_layers)]
        mx.eval(self._keys, self._values)
        pool.add_growth_listener(self._grow)

    @property
    def pool(self) -> PagePool:
        """The pool whose page ids index the arrays."""
        return self._pool

    @property
    def num_layers(self) -> int:
        """Layers."""
        return len(self._keys)

    @property
    def num_pages(self) -> int:
        """`P`, pages per array (the pool's capacity)."""
        return self._keys[0].shape[0]

    @property
    def page_shape(self) -> tuple[int, int, int, int]:
        """Shape of every array: `(P, H_kv, page_size, D)`."""
        return (self.num_pages, self._num_kv_heads, self._pool.page_size, self._head_dim)

    @property
    def dtype(self) -> mx.Dtype:
        """Element type of every array."""
        return self._dtype

    @property
    def keys(self) -> tuple[mx.array, ...]:
        """K page arrays, one per layer, each `[P, H_kv, page_size, D]` of `dtype`."""
        return tuple(self._keys)

    @property
    def values(self) -> tuple[mx.array, ...]:
        """V page arrays, one per layer, each `[P, H_kv, page_size, D]` of `dtype`."""
        return tuple(self._values)

    @property
    def nbytes(self) -> int:
        """Bytes held by all K and V arrays."""
        return sum(array.nbytes for array in self._keys + self._values)

    def step_arrays(self) -> list[mx.array]:
        """Every K and V array, to evaluate a step's writes together with its results."""
        return [*self._keys, *self._values]

    def snapshot(self) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]]:
        """The current array objects (not their data), for `restore`."""
        return self.keys, self.values

    def restore(self, snapshot: tuple[tuple[mx.array, ...], tuple[mx.array, ...]]) -> None:
        """Puts back the array objects of `snapshot` (after a step whose arrays failed to
        evaluate). In-place writes already made to those buffers stay."""
        self.update_layers(*snapshot)

    def update_layer(self, layer: int, keys: mx.array, values: mx.array) -> None:
        """Store layer `layer`'s arrays as returned by the in-place `write_kv` kernel.

        Args:
            layer: Layer index in `[0, num_layers)`.
            keys: `[P, H_kv, page_size, D]` of `dtype`.
            values: `[P, H_kv, page_size, D]` of `dtype`.

        Raises:
            InvalidArgument: Bad layer index, or an array of another shape or dtype.
        """
        layer = as_int(layer, "layer")
        if layer >= self.num_layers:
            raise InvalidArgument(f"layer must be in [0, {self.num_layers}), got {layer}")
        expected = self.page_shape
        self._check_page_array("keys", keys, expected)
        self._check_page_array("values", values, expected)
        self._keys[layer] = keys
        self._values[layer] = values

    def update_layers(self, keys: Sequence[mx.array], values: Sequence[mx.array]) -> None:
        """Store every layer's arrays at once (`keys[i]`, `values[i]` for layer `i`), as
        `update_layer` does one layer; nothing is stored unless all of them are valid.

        Raises:
            InvalidArgument: Not one array per layer, or an array of another shape or dtype.
        """
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise InvalidArgument(
                f"expected {self.num_layers} key and value arrays (one per layer), got "
                f"{len(keys)} and {len(values)}"
            )
        expected = self.page_shape
        for layer, (layer_keys, layer_values) in enumerate(zip(keys, values, strict=True)):
            self._check_page_array(f"keys[{layer}]", layer_keys, expected)
            self._check_page_array(f"values[{layer}]", layer_values, expected)
        self._keys[:] = keys
        self._values[:] = values

    def _check_page_array(self, name: str, array: object, expected: tuple[int, ...]) -> None:
        if not isinstance(array, mx.array):
            raise InvalidArgument(f"{name} must be an mx.array, got {type(array).__name__}")
        if tuple(array.shape) != expected or array.dtype != self._dtype:
            raise InvalidArgument(
                f"{name} has shape {tuple(array.shape)} and dtype {array.dtype}; expected "
                f"{expected} [P, H_kv, page_size, D] and {self._dtype}"
            )

    def copy_pages(self, copies: Sequence[PageCopy]) -> None:
        """Perform copy-on-write copies (`dst` page := `src` page) on every layer, lazily.

        All copies of a call become one indexed update per array (`k[dst_ids] = k[src_ids]`),
        left unevaluated for the caller's next evaluation (the engine evaluates storage once
        per step, after the model wrote).
        The update moves O(pages copied) data when MLX can donate the layer buffer to it, and
        copies the whole layer, O(pool), when it cannot. In mlx 0.32.4 on the CPU it cannot,
        because the update reads its sources from the buffer it writes. Copies are rare: they
        happen only after pages were shared on purpose (`PageList.fork`, `PagePool.share`).

        Args:
            copies: The copies `PageList.append` returned (`AppendResult.copies`).

        Raises:
            InvalidArgument: An entry is not a `PageCopy`, a destination repeats, or a
                destination is also a source (the result would depend on order).
            InvalidPageId: A page id is outside `[0, P)`.
        """
        copies = list(copies)
        for copy in copies:
            if not isinstance(copy, PageCopy):
                raise InvalidArgument(f"copies must hold PageCopy values, got {copy!r}")
            for page_id in (copy.src, copy.dst):
                if not 0 <= page_id < self.num_pages:
                    raise InvalidPageId(page_id, self.num_pages)
        src = [copy.src for copy in copies]
        dst = [copy.dst for copy in copies]
        if len(set(dst)) != len(dst) or set(dst) & set(src):
            raise InvalidArgument(
                f"copy destinations must be distinct and never a source, got {copies}"
            )
        if not copies:
            return
        src_ids = mx.array(src, dtype=mx.int32)
        dst_ids = mx.array(dst, dtype=mx.int32)
        for array in self._keys + self._values:
            array[dst_ids] = array[src_ids]  # in place on the array object: the lists see it

    def _grow(self, old_capacity: int, new_capacity: int) -> int:
        """Growth listener: enlarge every array to `new_capacity` pages; return bytes copied.

        All or nothing: the enlarged arrays are made and evaluated before any replaces its
        layer, so a failure (out of memory, say) leaves every layer as it was."""
        if new_capacity <= self.num_pages:
            return 0
        extra = self._filled(new_capacity - self.num_pages)
        keys = [mx.concatenate([array, extra], axis=0) for array in self._keys]
        values = [mx.concatenate([array, extra], axis=0) for array in self._values]
        mx.eval(keys, values)
        copied = sum(array.nbytes for array in self._keys + self._values)
        self._keys, self._values = keys, values
        return copied

    def _filled(self, num_pages: int) -> mx.array:
        shape = (num_pages, self._num_kv_heads, self._pool.page_size, self._head_dim)
        return mx.full(shape, self._fill_value, dtype=self._dtype)

    def __repr__(self) -> str:
        return (
            f"KVStorage(num_layers={self.num_layers}, page_shape={self.page_shape}, "
            f"dtype={self._dtype}, nbytes={self.nbytes})"
        )
