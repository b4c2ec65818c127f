"""Bad shapes, dtypes and attributes are rejected at the op boundary with a ValueError that
names what was wrong and what was expected."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import pagekernels as pk

f32, f16, i32 = mx.float32, mx.float16, mx.int32


def _paged_inputs() -> dict:
    """Valid paged_attention arguments: B=2, Hq=4, Hkv=2, L=1, D=64, P=5, page_size=4."""
    return {
        "queries": mx.zeros((2, 4, 1, 64)),
        "key_pages": mx.zeros((5, 2, 4, 64)),
        "value_pages": mx.zeros((5, 2, 4, 64)),
        "block_table": mx.zeros((2, 3), dtype=i32),
        "context_lens": mx.zeros((2,), dtype=i32),
        "page_size": 4,
    }


PAGED_CASES = [
    pytest.param(
        {"queries": mx.zeros((2, 4, 64))},
        r"queries must have rank 4 \[B, Hq, L, D\], got shape \(2, 4, 64\)",
        id="queries-rank",
    ),
    pytest.param(
        {"key_pages": mx.zeros((5, 8, 64))}, r"key_pages must have rank 4", id="key-pages-rank"
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 32))},
        r"value_pages must have the shape of key_pages \(5, 2, 4, 64\), got \(5, 2, 4, 32\)",
        id="value-pages-shape",
    ),
    pytest.param(
        {"block_table": mx.zeros((6,), dtype=i32)},
        r"block_table must have rank 2 \[B, max_pages\]",
        id="block-table-rank",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2, 1), dtype=i32)},
        r"context_lens must have rank 1 \[B\]",
        id="context-lens-rank",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 1, 64), dtype=i32)},
        r"queries must be float32, float16 or bfloat16, got int32",
        id="queries-int",
    ),
    pytest.param(
        {"key_pages": mx.zeros((5, 2, 4, 64), dtype=f16)},
        r"key_pages must have the dtype of queries \(float32\), got float16",
        id="key-pages-dtype",
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 64), dtype=f16)},
        r"value_pages must have the dtype of key_pages \(float32\), got float16",
        id="value-pages-dtype",
    ),
    pytest.param(
        {"block_table": mx.zeros((2, 3), dtype=mx.int64)},
        r"block_table must be int32, got int64",
        id="block-table-int64",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2,))},
        r"context_lens must be int32, got float32",
        id="context-lens-float",
    ),
    pytest.param({"page_size": 0}, r"page_size must be positive, got 0", id="page-size-zero"),
    pytest.param({"page_size": -4}, r"page_size must be positive, got -4", id="page-size-negative"),
    pytest.param(
        {"page_size": 8},
        r"key_pages.shape\[2\]=4 \(slots per page\) must equal page_size=8",
        id="page-size-mismatch",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 3, 1, 64))},
        r"query heads Hq=3 must be a multiple of key/value heads Hkv=2",
        id="gqa-ratio",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 1, 32))},
        r"key_pages.shape\[3\]=64 must equal queries.shape\[3\]=32",
        id="head-dim",
    ),
    pytest.param(
        {"block_table": mx.zeros((3, 3), dtype=i32), "context_lens": mx.zeros((3,), dtype=i32)},
        r"block_table.shape\[0\]=3 must equal queries.shape\[0\]=2",
        id="block-table-batch",
    ),
    pytest.param(
        {"context_lens": mx.zeros((1,), dtype=i32)},
        r"context_lens.shape\[0\]=1 must equal block_table.shape\[0\]=2",
        id="context-lens-batch",
    ),
    pytest.param(
        {"mask": "bidirectional"},
        r'mask must be None or "causal", got "bidirectional"',
        id="mask-string",
    ),
    pytest.param({"scale": float("nan")}, r"scale must be a finite number", id="scale-nan"),
]


# Shapes only the GPU kernels refuse; generated where MLX has a GPU (the H200 runs this suite).
GPU_HEAD_DIM = (
    r"head dim D=\d+ is not supported by the GPU kernels; expected a multiple of 8 up to 256"
)
if mx.cuda.is_available():
    PAGED_CASES += [
        pytest.param(
            {"queries": mx.zeros((2, 4, 1, 36)), "key_pages": mx.zeros((5, 2, 4, 36)),
             "value_pages": mx.zeros((5, 2, 4, 36)), "stream": mx.gpu},
            GPU_HEAD_DIM, id="gpu-head-dim-36",
        ),
    ]  # fmt: skip


@pytest.mark.parametrize(("change", "match"), PAGED_CASES)
def test_paged_attention_rejects(change, match):
    with pytest.raises(ValueError, match=r"^\[paged_attention\] " + match):
        pk.paged_attention(**(_paged_inputs() | change))


def _dense_inputs() -> dict:
    """Valid dense_attention arguments: B=2, Hq=4, Hkv=2, L=3, S=10, D=64."""
    return {
        "queries": mx.zeros((2, 4, 3, 64)),
        "keys": mx.zeros((2, 2, 10, 64)),
        "values": mx.zeros((2, 2, 10, 64)),
        "key_lens": mx.zeros((2,), dtype=i32),
    }


DENSE_CASES = [
    pytest.param(
        {"queries": mx.zeros((4, 3, 64))},
        r"queries must have rank 4 \[B, Hq, L, D\]",
        id="queries-rank",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 10, 64))}, r"keys must have rank 4 \[B, Hkv, S, D\]", id="keys-rank"
    ),
    pytest.param(
        {"values": mx.zeros((2, 2, 9, 64))},
        r"values must have the shape of keys \(2, 2, 10, 64\), got \(2, 2, 9, 64\)",
        id="values-shape",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 3, 64), dtype=mx.uint8)},
        r"queries must be float32, float16 or bfloat16, got uint8",
        id="queries-uint8",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 2, 10, 64), dtype=mx.bfloat16)},
        r"keys must have the dtype of queries \(float32\), got bfloat16",
        id="keys-dtype",
    ),
    pytest.param(
        {"values": mx.zeros((2, 2, 10, 64), dtype=f16)},
        r"values must have the dtype of queries",
        id="values-dtype",
    ),
    pytest.param(
        {"queries": mx.zeros((2, 4, 3, 128))},
        r"keys.shape\[3\]=64 must equal queries.shape\[3\]=128",
        id="head-dim",
    ),
    pytest.param(
        {"keys": mx.zeros((1, 2, 10, 64)), "values": mx.zeros((1, 2, 10, 64))},
        r"keys.shape\[0\]=1 must equal queries.shape\[0\]=2",
        id="batch",
    ),
    pytest.param(
        {"keys": mx.zeros((2, 3, 10, 64)), "values": mx.zeros((2, 3, 10, 64))},
        r"query heads Hq=4 must be a multiple of key/value heads Hkv=3",
        id="gqa-ratio",
    ),
    pytest.param(
        {"key_lens": mx.zeros((2, 1), dtype=i32)},
        r"key_lens must have rank 1 \[B\]",
        id="key-lens-rank",
    ),
    pytest.param(
        {"key_lens": mx.zeros((2,), dtype=mx.int64)},
        r"key_lens must be int32, got int64",
        id="key-lens-dtype",
    ),
    pytest.param(
        {"key_lens": mx.zeros((3,), dtype=i32)},
        r"key_lens.shape\[0\]=3 must equal queries.shape\[0\]=2",
        id="key-lens-batch",
    ),
    pytest.param(
        {"mask": "lower"}, r'mask must be None or "causal", got "lower"', id="mask-string"
    ),
]


if mx.cuda.is_available():
    DENSE_CASES += [
        pytest.param(
            {"queries": mx.zeros((2, 4, 3, 264)), "keys": mx.zeros((2, 2, 10, 264)),
             "values": mx.zeros((2, 2, 10, 264)), "stream": mx.gpu},
            GPU_HEAD_DIM, id="gpu-head-dim-264",
        ),
    ]  # fmt: skip


@pytest.mark.parametrize(("change", "match"), DENSE_CASES)
def test_dense_attention_rejects(change, match):
    with pytest.raises(ValueError, match=r"^\[dense_attention\] " + match):
        pk.dense_attention(**(_dense_inputs() | change))


def _write_inputs() -> dict:
    """Valid write_kv arguments: P=3, Hkv=2, page_size=4, D=8, T=5 (random pages)."""
    return {
        "key_pages": mx.random.normal((3, 2, 4, 8)),
        "value_pages": mx.random.normal((3, 2, 4, 8)),
        "keys": mx.ones((5, 2, 8)),
        "values": mx.ones((5, 2, 8)),
        "slot_mapping": mx.arange(5, dtype=i32),
    }


WRITE_CASES = [
    pytest.param(
        {"key_pages": mx.zeros((3, 2, 32))},
        r"key_pages must have rank 4 \[P, Hkv, page_size, D\]",
        id="pages-rank",
    ),
    pytest.param(
        {"value_pages": mx.zeros((4, 2, 4, 8))},
        r"value_pages must have the shape of key_pages",
        id="value-pages-shape",
    ),
    pytest.param(
        {"keys": mx.ones((5, 16))}, r"keys must have rank 3 \[T, Hkv, D\]", id="keys-rank"
    ),
    pytest.param(
        {"values": mx.ones((4, 2, 8))},
        r"values must have the shape of keys \(5, 2, 8\), got \(4, 2, 8\)",
        id="values-shape",
    ),
    pytest.param(
        {"slot_mapping": mx.zeros((5, 1), dtype=i32)},
        r"slot_mapping must have rank 1 \[T\]",
        id="slots-rank",
    ),
    pytest.param(
        {
            "key_pages": mx.zeros((3, 2, 4, 8), dtype=i32),
            "value_pages": mx.zeros((3, 2, 4, 8), dtype=i32),
        },
        r"key_pages must be float32, float16 or bfloat16, got int32",
        id="pages-int",
    ),
    pytest.param(
        {"keys": mx.ones((5, 2, 8), dtype=f16)},
        r"keys must have the dtype of key_pages \(float32\), got float16",
        id="keys-dtype",
    ),
    pytest.param(
        {"slot_mapping": mx.arange(5, dtype=mx.int64)},
        r"slot_mapping must be int32, got int64",
        id="slots-int64",
    ),
    pytest.param(
        {"keys": mx.ones((5, 1, 8)), "values": mx.ones((5, 1, 8))},
        r"keys.shape\[1\]=1 must equal key_pages.shape\[1\]=2",
        id="kv-heads",
    ),
    pytest.param(
        {"keys": mx.ones((5, 2, 4)), "values": mx.ones((5, 2, 4))},
        r"keys.shape\[2\]=4 must equal key_pages.shape\[3\]=8",
        id="head-dim",
    ),
    pytest.param(
        {"slot_mapping": mx.arange(4, dtype=i32)},
        r"slot_mapping.shape\[0\]=4 must equal keys.shape\[0\]=5",
        id="tokens",
    ),
]


@pytest.mark.parametrize(("change", "match"), WRITE_CASES)
def test_write_kv_rejects_and_changes_nothing(change, match):
    inputs = _write_inputs() | change
    before = [np.array(inputs[name].astype(f32)) for name in ("key_pages", "value_pages")]
    with pytest.raises(ValueError, match=r"^\[write_kv\] " + match):
        pk.write_kv(**inputs)
    for name, host in zip(("key_pages", "value_pages"), before, strict=True):
        np.testing.assert_array_equal(np.array(inputs[name].astype(f32)), host)


def _gather_inputs() -> dict:
    """Valid gather_kv arguments: P=5, Hkv=2, page_size=4, D=8, B=2, max_pages=3."""
    return {
        "key_pages": mx.zeros((5, 2, 4, 8)),
        "value_pages": mx.zeros((5, 2, 4, 8)),
        "block_table": mx.zeros((2, 3), dtype=i32),
        "context_lens": mx.zeros((2,), dtype=i32),
        "page_size": 4,
    }


GATHER_CASES = [
    pytest.param(
        {"key_pages": mx.zeros((5, 8, 8))}, r"key_pages must have rank 4", id="pages-rank"
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 4))},
        r"value_pages must have the shape of key_pages",
        id="value-pages-shape",
    ),
    pytest.param(
        {"block_table": mx.zeros((6,), dtype=i32)},
        r"block_table must have rank 2",
        id="block-table-rank",
    ),
    pytest.param(
        {"context_lens": mx.zeros((), dtype=i32)},
        r"context_lens must have rank 1",
        id="context-lens-rank",
    ),
    pytest.param(
        {
            "key_pages": mx.zeros((5, 2, 4, 8), dtype=mx.bool_),
            "value_pages": mx.zeros((5, 2, 4, 8), dtype=mx.bool_),
        },
        r"key_pages must be float32, float16 or bfloat16, got bool",
        id="pages-bool",
    ),
    pytest.param(
        {"value_pages": mx.zeros((5, 2, 4, 8), dtype=f16)},
        r"value_pages must have the dtype of key_pages",
        id="values-dtype",
    ),
    pytest.param(
        {"block_table": mx.zeros((2, 3), dtype=mx.uint32)},
        r"block_table must be int32, got uint32",
        id="block-table-dtype",
    ),
    pytest.param(
        {"context_lens": mx.zeros((2,), dtype=mx.int16)},
        r"context_lens must be int32, got int16",
        id="context-lens-dtype",
    ),
    pytest.param({"page_size": 0}, r"page_size must be positive, got 0", id="page-size-zero"),
    pytest.param(
        {"page_size": 2},
        r"key_pages.shape\[2\]=4 \(slots per page\) must equal page_size=2",
        id="page-size-mismatch",
    ),
    pytest.param(
        {"context_lens": mx.zeros((3,), dtype=i32)},
        r"context_lens.shape\[0\]=3 must equal block_table.shape\[0\]=2",
        id="batch",
    ),
]


@pytest.mark.parametrize(("change", "match"), GATHER_CASES)
def test_gather_kv_rejects(change, match):
    with pytest.raises(ValueError, match=r"^\[gather_kv\] " + match):
        pk.gather_kv(**(_gather_inputs() | change))


def _embedding_inputs() -> dict:
    """Valid quantized_embedding arguments: V=6, dims=128, bits=4, group_size=64."""
    weight, scales, biases = mx.quantize(mx.zeros((6, 128)), group_size=64, bits=4)
    return {
        "indices": mx.array([1, 2], dtype=i32),
        "weight": weight,
        "scales": scales,
        "biases": biases,
        "group_size": 64,
        "bits": 4,
    }


EMBEDDING_CASES = [
    pytest.param(
        {"indices": mx.array([1.0])},
        r"indices must have an integer dtype, got float32",
        id="float-indices",
    ),
    pytest.param(
        {"bits": 7},
        r"bits must be one of 1, 2, 3, 4, 5, 6, 8 \(mx.quantize affine\), got 7",
        id="bits-7",
    ),
    pytest.param({"bits": 16}, r"bits must be one of .*, got 16", id="bits-16"),
    pytest.param(
        {"group_size": 16}, r"group_size must be one of 32, 64, 128, got 16", id="group-16"
    ),
    pytest.param(
        {"weight": mx.zeros((6 * 16,), dtype=mx.uint32)},
        r"weight must have rank 2 \[V, dims \* bits / 32\]",
        id="weight-rank",
    ),
    pytest.param(
        {"weight": mx.zeros((6, 16), dtype=i32)},
        r"weight must be uint32, got int32",
        id="weight-dtype",
    ),
    pytest.param(
        {"scales": mx.zeros((12,))},
        r"scales must have rank 2 \[V, dims / group_size\]",
        id="scales-rank",
    ),
    pytest.param(
        {"scales": mx.zeros((6, 2), dtype=i32), "biases": mx.zeros((6, 2), dtype=i32)},
        r"scales must be float32, float16 or bfloat16, got int32",
        id="scales-int",
    ),
    pytest.param(
        {"biases": mx.zeros((6, 4))},
        r"biases must have the shape of scales \(6, 2\), got \(6, 4\)",
        id="biases-shape",
    ),
    pytest.param(
        {"biases": mx.zeros((6, 2), dtype=f16)},
        r"biases must have the dtype of scales",
        id="biases-dtype",
    ),
    pytest.param(
        {"scales": mx.zeros((5, 2)), "biases": mx.zeros((5, 2))},
        r"scales.shape\[0\]=5 must equal weight.shape\[0\]=6",
        id="rows",
    ),
    pytest.param(
        {"group_size": 32},
        r"scales.shape\[1\]=2 must equal dims / group_size = 128 / 32",
        id="groups",
    ),
    pytest.param(
        {"bits": 3, "weight": mx.zeros((6, 1), dtype=mx.uint32)},
        r"weight.shape\[1\]=1 uint32 words do not hold a whole number of 3-bit values",
        id="packing",
    ),
]


@pytest.mark.parametrize(("change", "match"), EMBEDDING_CASES)
def test_quantized_embedding_rejects(change, match):
    with pytest.raises(ValueError, match=r"^\[quantized_embedding\] " + match):
        pk.quantized_embedding(**(_embedding_inputs() | change))
