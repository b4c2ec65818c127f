"""KVStorage: layout, dtypes, update_layer(s) checks, copy-on-write copies, growth with the pool."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from pagepool_test_helpers import read_tokens, snapshot, write_tokens

from pagepool import (
    InvalidArgument,
    InvalidPageId,
    KVStorage,
    PageCopy,
    PageList,
    PagePool,
)

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layout_is_one_page_array_per_layer(dtype: mx.Dtype) -> None:
    pool = PagePool(page_size=5, num_pages=7)
    storage = KVStorage(
        pool, num_layers=3, num_kv_heads=2, head_dim=6, dtype=dtype, fill_value=math.nan
    )
    assert storage.page_shape == (7, 2, 5, 6) and storage.num_layers == 3
    for array in storage.keys + storage.values:
        assert array.shape == (7, 2, 5, 6) and array.dtype == dtype
        assert mx.isnan(array).all().item()
    assert storage.nbytes == 2 * 3 * 7 * 2 * 5 * 6 * dtype.size


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": mx.int32}, "dtype must be one of float32, float16, bfloat16"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"num_layers": 0}, "num_layers must be an int >= 1, got 0"),
        ({"num_kv_heads": -1}, "num_kv_heads must be an int >= 1"),
        ({"head_dim": 2.5}, "head_dim must be an int >= 1"),
        ({"fill_value": "nan"}, "fill_value must be a float"),
        ({"fill_value": True}, "fill_value must be a float, got True"),
    ],
    ids=[
        "int-dtype",
        "str-dtype",
        "no-layers",
        "negative-heads",
        "float-head-dim",
        "str-fill",
        "bool-fill",
    ],  # fmt: skip
)
def test_constructor_rejects_bad_arguments(pool: PagePool, kwargs: dict, match: str) -> None:
    arguments = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 4, "dtype": mx.float16, **kwargs}
    with pytest.raises(InvalidArgument, match=match):
        KVStorage(pool, **arguments)
    with pytest.raises(InvalidArgument, match="pool must be a PagePool"):
        KVStorage(None, num_layers=1, num_kv_heads=1, head_dim=4, dtype=mx.float16)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tokens_written_by_slot_read_back_through_the_page_list(dtype: mx.Dtype) -> None:
    pool = PagePool(page_size=3, num_pages=9)
    storage = KVStorage(
        pool, num_layers=2, num_kv_heads=2, head_dim=4, dtype=dtype, fill_value=math.nan
    )
    a, b = PageList(pool), PageList(pool)
    for pages, tokens in ((a, [5, 6, 7, 8]), (b, [20, 21]), (a, [9, 10, 11]), (b, [22])):
        write_tokens(storage, pages.append(len(tokens)).slots, tokens)
    assert read_tokens(storage, a.page_ids, a.context_len) == [5, 6, 7, 8, 9, 10, 11]
    assert read_tokens(storage, b.page_ids, b.context_len) == [20, 21, 22]


def test_update_layer_replaces_one_layer(storage: KVStorage) -> None:
    keys = mx.random.normal(storage.page_shape)
    values = mx.random.normal(storage.page_shape)
    untouched = storage.keys[0]
    storage.update_layer(1, keys, values)
    assert storage.keys[1] is keys and storage.values[1] is values
    assert storage.keys[0] is untouched


@pytest.mark.parametrize(
    ("layer", "keys", "values", "match"),
    [
        (2, None, None, r"layer must be in \[0, 2\), got 2"),
        (-1, None, None, "layer must be an int >= 0"),
        (0, "wrong-shape", None, r"keys has shape \(8, 2, 4, 4\).*expected \(8, 2, 4, 3\)"),
        (0, None, "wrong-dtype", "values has shape .* and dtype mlx.core.float16; expected"),
        (0, "numpy", None, "keys must be an mx.array, got ndarray"),
    ],
    ids=["layer-too-large", "negative-layer", "shape", "dtype", "not-mx"],
)
def test_update_layer_rejects_and_changes_nothing(
    storage: KVStorage, layer: int, keys: object, values: object, match: str
) -> None:
    good = mx.zeros(storage.page_shape, dtype=mx.float32)
    bad = {
        "wrong-shape": mx.zeros((8, 2, 4, 4), dtype=mx.float32),
        "wrong-dtype": mx.zeros(storage.page_shape, dtype=mx.float16),
        "numpy": np.zeros(storage.page_shape, dtype=np.float32),
    }
    before = (storage.keys, storage.values)
    with pytest.raises(InvalidArgument, match=match):
        storage.update_layer(layer, bad.get(keys, good), bad.get(values, good))
    assert all(
        x is y for x, y in zip(storage.keys + storage.values, before[0] + before[1], strict=True)
    )


def test_update_layers_replaces_every_layer(storage: KVStorage) -> None:
    keys = [mx.random.normal(storage.page_shape) for _ in range(storage.num_layers)]
    values = [mx.random.normal(storage.page_shape) for _ in range(storage.num_layers)]
    storage.update_layers(keys, values)
    assert all(a is b for a, b in zip(storage.keys + storage.values, keys + values, strict=True))


@pytest.mark.parametrize(
    ("bad_layer", "bad", "match"),
    [
        (None, "missing", r"expected 2 key and value arrays \(one per layer\), got 1 and 2"),
        (1, "wrong-shape", r"keys\[1\] has shape \(8, 2, 4, 4\).*expected \(8, 2, 4, 3\)"),
        (1, "wrong-dtype", r"keys\[1\] has shape .* and dtype mlx.core.float16; expected"),
        (0, "numpy", r"keys\[0\] must be an mx.array, got ndarray"),
    ],
    ids=["missing-layer", "shape", "dtype", "not-mx"],
)
def test_update_layers_rejects_and_changes_nothing(
    storage: KVStorage, bad_layer: int | None, bad: str, match: str
) -> None:
    keys: list[object] = [mx.zeros(storage.page_shape) for _ in range(storage.num_layers)]
    values = [mx.zeros(storage.page_shape) for _ in range(storage.num_layers)]
    if bad == "missing":
        keys.pop()
    else:
        keys[bad_layer] = {
            "wrong-shape": mx.zeros((8, 2, 4, 4)),
            "wrong-dtype": mx.zeros(storage.page_shape, dtype=mx.float16),
            "numpy": np.zeros(storage.page_shape, dtype=np.float32),
        }[bad]
    before = storage.keys + storage.values
    with pytest.raises(InvalidArgument, match=match):
        storage.update_layers(keys, values)  # type: ignore[arg-type]
    assert all(x is y for x, y in zip(storage.keys + storage.values, before, strict=True))


def test_copy_pages_copies_on_every_layer_and_nothing_else(storage: KVStorage) -> None:
    for layer in range(storage.num_layers):
        storage.update_layer(
            layer, mx.random.normal(storage.page_shape), mx.random.normal(storage.page_shape)
        )
    before = [np.array(array) for array in storage.keys + storage.values]
    storage.copy_pages([PageCopy(src=1, dst=6), PageCopy(src=2, dst=0)])
    for old, new in zip(before, storage.keys + storage.values, strict=True):
        expected = old.copy()
        expected[6], expected[0] = old[1], old[2]
        np.testing.assert_array_equal(np.array(new), expected)
    storage.copy_pages([])


@pytest.mark.parametrize(
    ("copies", "error", "match"),
    [
        ([PageCopy(src=1, dst=8)], InvalidPageId, r"page id 8 is not an int in \[0, 8\)"),
        ([PageCopy(src=1, dst=3), PageCopy(src=2, dst=3)], InvalidArgument, "distinct"),
        ([PageCopy(src=1, dst=3), PageCopy(src=3, dst=4)], InvalidArgument, "never a source"),
        ([(1, 3)], InvalidArgument, "copies must hold PageCopy values"),
    ],
    ids=["out-of-range", "repeated-destination", "chained", "not-a-page-copy"],
)
def test_copy_pages_rejects_and_changes_nothing(
    storage: KVStorage, copies: list, error: type, match: str
) -> None:
    before = [np.array(array) for array in storage.keys + storage.values]
    with pytest.raises(error, match=match):
        storage.copy_pages(copies)
    for old, new in zip(before, storage.keys + storage.values, strict=True):
        np.testing.assert_array_equal(np.array(new), old)


def test_copy_pages_stays_lazy(storage: KVStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine evaluates storage once per step: copies must not synchronise on their own.
    for layer in range(storage.num_layers):
        storage.update_layer(
            layer, mx.random.normal(storage.page_shape), mx.random.normal(storage.page_shape)
        )
    before = [np.array(array) for array in storage.keys + storage.values]

    def no_eval(*arrays: object) -> None:
        raise AssertionError("copy_pages evaluated its arrays")

    monkeypatch.setattr(mx, "eval", no_eval)
    storage.copy_pages([PageCopy(src=1, dst=6)])
    monkeypatch.undo()
    for old, new in zip(before, storage.keys + storage.values, strict=True):
        expected = old.copy()
        expected[6] = old[1]
        np.testing.assert_array_equal(np.array(new), expected)


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        (-1, 2, "PageCopy.src must be an int >= 0, got -1"),
        (1, 1.0, "PageCopy.dst must be an int >= 0, got 1.0"),
        (True, 2, "PageCopy.src must be an int >= 0, got True"),
        (3, 3, "differ"),
    ],
    ids=["negative", "float", "bool", "same"],
)
def test_page_copy_validates_its_ids(src: object, dst: object, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        PageCopy(src=src, dst=dst)  # type: ignore[arg-type]


def test_page_copy_accepts_numpy_integers_as_ints() -> None:
    copy = PageCopy(src=np.int64(3), dst=np.int32(5))  # type: ignore[arg-type]
    assert (copy.src, copy.dst) == (3, 5) and type(copy.src) is int and type(copy.dst) is int


def test_copy_on_write_keeps_both_requests_intact(storage: KVStorage, pool: PagePool) -> None:
    parent = PageList(pool)
    write_tokens(storage, parent.append(6).slots, [1, 2, 3, 4, 5, 6])
    child = parent.fork()
    result = child.append(2)
    storage.copy_pages(result.copies)
    write_tokens(storage, result.slots, [70, 71])
    write_tokens(storage, parent.append(1).slots, [7])
    assert read_tokens(storage, parent.page_ids, parent.context_len) == [1, 2, 3, 4, 5, 6, 7]
    assert read_tokens(storage, child.page_ids, child.context_len) == [1, 2, 3, 4, 5, 6, 70, 71]


def test_storage_grows_with_the_pool_and_reports_copied_bytes() -> None:
    pool = PagePool(page_size=2, num_pages=2, growable=True)
    storage = KVStorage(
        pool, num_layers=2, num_kv_heads=1, head_dim=3, dtype=mx.float16, fill_value=math.nan
    )
    pages = PageList(pool)
    write_tokens(storage, pages.append(3).slots, [4, 5, 6])
    bytes_before = storage.nbytes
    write_tokens(storage, pages.append(6).slots, [7, 8, 9, 10, 11, 12])  # 9 tokens: 5 pages
    assert pool.capacity == 8 and storage.num_pages == 8
    assert storage.nbytes == 4 * bytes_before
    metrics = pool.metrics()
    assert (metrics.num_growths, metrics.growth_copied_bytes) == (1, bytes_before)
    assert read_tokens(storage, pages.page_ids, pages.context_len) == list(range(4, 13))
    unused = [p for p in range(8) if pool.refcount(p) == 0]
    assert mx.isnan(storage.keys[1][mx.array(unused)]).all().item()


@pytest.mark.parametrize(
    ("function", "failing_call"),
    [("eval", 1), ("concatenate", 2)],
    ids=["evaluation", "second-array"],
)
def test_a_growth_that_fails_leaves_every_layer_as_it_was(
    monkeypatch, function: str, failing_call: int
) -> None:
    """Out of memory while the enlarged arrays are evaluated (where MLX reports it) or built:
    no layer is replaced, the append fails and changes nothing, and the retry grows every
    layer."""
    pool = PagePool(page_size=2, num_pages=2, growable=True)
    storage = KVStorage(pool, num_layers=2, num_kv_heads=1, head_dim=3, dtype=mx.float32)
    pages = PageList(pool)
    write_tokens(storage, pages.append(4).slots, [4, 5, 6, 7])
    arrays_before = storage.keys + storage.values
    real, calls = getattr(mx, function), []

    def out_of_memory(*args, **kwargs):
        calls.append(args)
        if len(calls) == failing_call:
            raise MemoryError(f"simulated: mx.{function} out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(mx, function, out_of_memory)
    before = snapshot(pool)
    with pytest.raises(MemoryError):
        pages.append(1)
    monkeypatch.undo()
    assert snapshot(pool) == before and pool.capacity == 2
    assert all(a is b for a, b in zip(storage.keys + storage.values, arrays_before, strict=True))
    write_tokens(storage, pages.append(1).slots, [8])
    assert {array.shape[0] for array in storage.keys + storage.values} == {pool.capacity} == {4}
    assert read_tokens(storage, pages.page_ids, pages.context_len) == [4, 5, 6, 7, 8]


def test_storage_created_after_growth_matches_capacity(growable_pool: PagePool) -> None:
    growable_pool.allocate(5)
    storage = KVStorage(growable_pool, num_layers=1, num_kv_heads=1, head_dim=2, dtype=mx.float32)
    assert storage.num_pages == growable_pool.capacity == 8
    before = snapshot(growable_pool)
    assert storage._grow(4, 8) == 0  # a growth it already covers copies nothing
    assert snapshot(growable_pool) == before and "KVStorage(num_layers=1" in repr(storage)


def test_snapshot_restores_the_array_objects_and_step_arrays_lists_them(
    storage: KVStorage,
) -> None:
    before = storage.snapshot()
    for layer in range(storage.num_layers):
        storage.update_layer(layer, storage.keys[layer] + 1, storage.values[layer] * 2)
    listed = storage.step_arrays()
    assert all(a is b for a, b in zip(listed, [*storage.keys, *storage.values], strict=True))
    assert all(a is not b for a, b in zip(storage.keys, before[0], strict=True))
    storage.restore(before)
    assert all(a is b for a, b in zip(storage.keys, before[0], strict=True))
    assert all(a is b for a, b in zip(storage.values, before[1], strict=True))
