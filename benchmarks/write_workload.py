"""The write path's workload: one decode step's new K/V rows, `write_kv`, and the naive write.

The seed: "A fast page-reading kernel cannot recover time lost to a functional whole-cache update
before every layer." So `write_kv` (in place, B rows) is timed beside `functional_write_kv`
(copy the pool, then scatter), which is what a functional array update costs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
from attention_workload import PagedInputs, Shape

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["WriteInputs", "functional_write_kv", "make_write_inputs", "write_call"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class WriteInputs:
    """One decode step's new K/V for `write_kv`.

    Attributes:
        keys: [T, Hkv, D] with T = B * L new tokens.
        values: [T, Hkv, D].
        slot_mapping: int32 [T], the slot of each row's last context position.
    """

    keys: mx.array
    values: mx.array
    slot_mapping: mx.array


def make_write_inputs(shape: Shape, pages: PagedInputs, *, seed: int) -> WriteInputs:
    """New rows for the last `query_len` positions of every row of `pages`' block table."""
    block_table = np.asarray(pages.block_table)
    positions = np.arange(shape.context - shape.query_len, shape.context)
    page_ids = block_table[:, positions // shape.page_size]
    slots = (page_ids * shape.page_size + positions % shape.page_size).reshape(-1)
    k_key, v_key = mx.random.split(mx.random.key(seed + 1))
    rows = (len(slots), shape.heads_kv, shape.head_dim)
    keys = mx.random.normal(rows, key=k_key).astype(shape.mx_dtype)
    values = mx.random.normal(rows, key=v_key).astype(shape.mx_dtype)
    mx.eval(keys, values)
    return WriteInputs(keys=keys, values=values, slot_mapping=mx.array(slots.astype(np.int32)))


def write_call(
    backend: KernelBackend, rows: WriteInputs
) -> Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]:
    """One decode step's `write_kv` into (key_pages, value_pages); returns the updated pages."""

    def write(key_pages: mx.array, value_pages: mx.array) -> tuple[mx.array, mx.array]:
        return backend.write_kv(key_pages, value_pages, rows.keys, rows.values, rows.slot_mapping)

    return write


def functional_write_kv(
    key_pages: mx.array, value_pages: mx.array, keys: mx.array, values: mx.array, slots: mx.array
) -> tuple[mx.array, mx.array]:
    """The naive write: copy each whole pool, then scatter the new rows (what `write_kv` avoids).

    Args:
        key_pages, value_pages: [P, Hkv, ps, D].
        keys, values: [T, Hkv, D].
        slots: int32 [T], all valid.

    Returns:
        New (key_pages, value_pages) arrays.
    """
    page_size = key_pages.shape[2]
    pages, offsets = slots // page_size, slots % page_size
    updated = []
    for pool, rows in ((key_pages, keys), (value_pages, values)):
        copy = pool + 0  # a fresh buffer: the original pool stays referenced
        copy[pages, :, offsets] = rows
        updated.append(copy)
    return updated[0], updated[1]
