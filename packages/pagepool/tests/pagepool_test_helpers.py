"""Helpers shared by the pagepool tests: state snapshots and a readable token write/read.

The write here is a test oracle (it rebuilds the layer array); the serving write path is the
in-place `write_kv` kernel of pagekernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from pagepool import KVStorage, PageList, PagePool


def snapshot(pool: PagePool, *lists: PageList) -> tuple:
    """Everything observable about a pool and some lists, for before/after comparisons."""
    refcounts = tuple(pool.refcount(page_id) for page_id in range(pool.capacity))
    free_order = tuple(pool._free_ids)  # allocation order must survive a failed call too
    rows = tuple(
        ("released",) if pages.released else (pages.page_ids, pages.context_len) for pages in lists
    )
    return pool.metrics(), refcounts, free_order, rows


def write_tokens(storage: KVStorage, slots: Sequence[int], tokens: Sequence[int]) -> None:
    """Store token id `t` as K = t and V = -t (every head and dim) at each slot, every layer."""
    if not slots:
        return
    P, H, page_size, D = storage.page_shape
    slot_ids = mx.array(list(slots), dtype=mx.int32)
    rows = mx.broadcast_to(
        mx.array(list(tokens), dtype=storage.dtype)[:, None, None], (len(slots), H, D)
    )
    for layer in range(storage.num_layers):
        pages = []
        for array, sign in ((storage.keys[layer], 1), (storage.values[layer], -1)):
            flat = array.transpose(0, 2, 1, 3).reshape(P * page_size, H, D)
            flat[slot_ids] = sign * rows
            pages.append(flat.reshape(P, page_size, H, D).transpose(0, 2, 1, 3))
        storage.update_layer(layer, *pages)


def read_tokens(storage: KVStorage, page_ids: Sequence[int], context_len: int) -> list[int]:
    """Token ids of logical positions 0..context_len-1 through a block-table row.

    Checks on the way that every layer, head and dim agrees and that V = -K.
    """
    if context_len == 0:
        return []
    _, H, page_size, D = storage.page_shape
    index = mx.array(list(page_ids), dtype=mx.int32)
    tokens = None
    for layer in range(storage.num_layers):
        for array, sign in ((storage.keys[layer], 1), (storage.values[layer], -1)):
            dense = array[index].transpose(0, 2, 1, 3).reshape(-1, H, D)[:context_len]
            dense = sign * dense.astype(mx.float32)
            assert mx.array_equal(dense, mx.broadcast_to(dense[:, :1, :1], dense.shape)).item()
            values = dense[:, 0, 0].tolist()
            tokens = values if tokens is None else tokens
            assert values == tokens, f"layer {layer} disagrees: {values} != {tokens}"
    return [int(t) for t in tokens]
