"""`decoder_layer` (one Qwen3 decoder layer over paged K/V): its four outputs against the
reference equation evaluated in float32 (`reference.DECODER_LAYER_TOLERANCE`) on every device,
for decode steps (one `DecoderLayer` node on a GPU stream) and prefill chunks (the other ops
composed); pages outside the step's slots untouched; `mx.compile`; bad arguments rejected at
the boundary."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import pagekernels
from pagekernels import DecoderLayerWeights, reference
from pagekernels.reference import DECODER_LAYER_TOLERANCE

EPS = 1e-6
ROPE_BASE = 1_000_000.0
# Hq = 4, Hkv = 2 (GQA), D = 64, H = 128, I = 192: every width the fused path needs.
HIDDEN, INTERMEDIATE, HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS = 128, 192, 64, 4, 2


def _weights(dtype: mx.Dtype, rng: np.random.Generator, head_dim: int) -> DecoderLayerWeights:
    def normal(*dims: int, scale: float = 0.1, mean: float = 0.0) -> mx.array:
        values = mean + scale * rng.standard_normal(dims)
        return mx.array(values.astype(np.float32)).astype(dtype)

    H, D, inter = HIDDEN, head_dim, INTERMEDIATE
    return DecoderLayerWeights(
        input_layernorm=normal(H, mean=1.0),
        qkv_proj=normal((NUM_Q_HEADS + 2 * NUM_KV_HEADS) * D, H),
        q_norm=normal(D, mean=1.0),
        k_norm=normal(D, mean=1.0),
        o_proj=normal(H, NUM_Q_HEADS * D),
        post_attention_layernorm=normal(H, mean=1.0),
        gate_up_proj=normal(2 * inter, H),
        down_proj=normal(H, inter),
    )


def _layer_inputs(
    make_paged, *, contexts, query_len, page_size, dtype, pending, seed=0, head_dim=HEAD_DIM
):
    """decoder_layer's arguments as a dict: random residual/pending/weights, pages holding
    each row's context (NaN elsewhere), and the tables of its last `query_len` tokens."""
    rng = np.random.default_rng(seed)
    case = make_paged(
        contexts=contexts,
        num_q_heads=NUM_Q_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        query_len=query_len,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        seed=seed,
    )
    B = len(contexts)

    def stream(*dims: int) -> mx.array:
        return mx.array(rng.standard_normal(dims).astype(np.float32)).astype(dtype)

    slots = [
        row[t // page_size] * page_size + t % page_size
        for row, context in zip(case.table, contexts, strict=True)
        for t in range(context - query_len, context)
    ]
    return dict(
        residual=stream(B, query_len, HIDDEN),
        pending=stream(B, query_len, HIDDEN) if pending else None,
        weights=_weights(dtype, rng, head_dim),
        key_pages=case.key_pages,
        value_pages=case.value_pages,
        block_table=case.block_table,
        context_lens=case.context_lens,
        slot_mapping=mx.array(slots, dtype=mx.int32),
        offsets=mx.array([c - query_len for c in contexts], dtype=mx.int32),
        page_size=page_size,
    )


def _with_own_pages(args: dict) -> dict:
    """`args` with copies of the pages: decoder_layer writes pages in place, so two runs that
    are compared must not share them."""
    pages = {name: mx.array(args[name]) for name in ("key_pages", "value_pages")}
    mx.eval(*pages.values())
    return args | pages


def _primitive_counts(tmp_path: Path, outputs) -> collections.Counter[str]:
    path = tmp_path / "graph.dot"
    mx.export_to_dot(str(path), *outputs)
    return collections.Counter(re.findall(r'label ="([A-Za-z]+)', path.read_text()))


def _pages_as_numpy(pages: mx.array) -> np.ndarray:
    return np.array(pages.astype(mx.float32))


@pytest.mark.parametrize("head_dim", [64, 128, 192], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize("pending", [True, False], ids=["pending", "first-layer"])
@pytest.mark.parametrize(
    "contexts, query_len, page_size",
    # decode (the fused node on a GPU stream, bf16/f16), one row, a prefill chunk
    [((5, 33, 17), 1, 16), ((1,), 1, 8), ((9, 4), 4, 4)],
    ids=["decode", "decode-one-token", "prefill"],
)
def test_matches_the_exact_equation(
    device,
    poison_allocator,
    make_paged,
    dtype,
    pending,
    contexts,
    query_len,
    page_size,
    head_dim,
):
    args = _layer_inputs(
        make_paged,
        contexts=contexts,
        query_len=query_len,
        page_size=page_size,
        dtype=dtype,
        pending=pending,
        head_dim=head_dim,
    )
    mx.eval(*[a for a in args.values() if isinstance(a, mx.array)], *args["weights"])
    before = _pages_as_numpy(args["key_pages"]), _pages_as_numpy(args["value_pages"])
    exact = reference.decoder_layer(**_upcast(args), eps=EPS, rope_base=ROPE_BASE)
    mx.eval(exact)
    for _ in range(2):
        poison_allocator(args["residual"].shape, dtype)
    got = pagekernels.decoder_layer(**args, eps=EPS, rope_base=ROPE_BASE, stream=device)
    assert [a.dtype for a in got] == [dtype] * 4
    tol = DECODER_LAYER_TOLERANCE[dtype]
    for actual, wanted in zip(got[:2], exact[:2], strict=True):
        _assert_scaled_close(np.array(actual.astype(mx.float32)), np.array(wanted), tol)
    # The step's slots hold its new K/V; every other slot (NaN included) is untouched.
    written = np.zeros(args["key_pages"].shape[0] * page_size, dtype=bool)
    written[np.array(args["slot_mapping"])] = True
    written = written.reshape(-1, page_size)
    for pages, wanted, old in zip(got[2:], exact[2:], before, strict=True):
        actual = _pages_as_numpy(pages).transpose(0, 2, 1, 3)  # [P, ps, Hkv, D]
        _assert_scaled_close(actual[written], np.array(wanted).transpose(0, 2, 1, 3)[written], tol)
        np.testing.assert_array_equal(actual[~written], old.transpose(0, 2, 1, 3)[~written])


def test_padding_rows_write_no_kv(device, make_paged):
    """A bucketed decode batch's padding row (no pages, context 0, slot -1) writes nothing and
    attends to nothing; the real rows are unaffected by it."""
    args = _layer_inputs(
        make_paged, contexts=(6, 19), query_len=1, page_size=8, dtype=mx.bfloat16, pending=True
    )
    padded = dict(args)
    for name, pad in [
        ("residual", args["residual"][:1]),
        ("pending", args["pending"][:1]),
        ("block_table", mx.full((1, args["block_table"].shape[1]), -1, dtype=mx.int32)),
        ("context_lens", mx.array([0], dtype=mx.int32)),
        ("slot_mapping", mx.array([-1], dtype=mx.int32)),
        ("offsets", mx.array([0], dtype=mx.int32)),
    ]:
        padded[name] = mx.concatenate([args[name], pad])
    kwargs = dict(eps=EPS, rope_base=ROPE_BASE, stream=device)
    alone = pagekernels.decoder_layer(**_with_own_pages(args), **kwargs)
    with_padding = pagekernels.decoder_layer(**_with_own_pages(padded), **kwargs)
    # (The attention's split plan depends on the batch: equal up to its rounding, not bits.)
    for a, b in zip(alone[:2], with_padding[:2], strict=True):
        np.testing.assert_allclose(
            np.array(b[:2].astype(mx.float32)), np.array(a.astype(mx.float32)), atol=2e-2, rtol=2e-2
        )
    for a, b in zip(alone[2:], with_padding[2:], strict=True):
        assert mx.array_equal(a, b, equal_nan=True).item()


def _upcast(args: dict) -> dict:
    """The same arguments with every float array in float32 (the exact oracle's inputs)."""

    def up(a):
        return (
            a.astype(mx.float32)
            if isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)
            else a
        )

    return {k: up(v) for k, v in args.items()} | {
        "weights": DecoderLayerWeights(*map(up, args["weights"]))
    }


def _assert_scaled_close(actual: np.ndarray, exact: np.ndarray, tol: float) -> None:
    """`DECODER_LAYER_TOLERANCE`'s bound: finite, and within `tol * max|exact|` everywhere."""
    assert actual.shape == exact.shape
    assert np.isfinite(actual).all(), "output holds NaN/inf (poisoned storage was read?)"
    scale = float(np.abs(exact).max())
    np.testing.assert_allclose(actual, exact, rtol=0, atol=tol * scale)


# The DecoderLayer node exists on GPU streams only: without a CUDA GPU this test is not defined
# (nothing to skip; the CPU composition is tested below).
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
def _test_a_gpu_decode_step_is_one_graph_node(tmp_path, make_paged, dtype):
    args = _layer_inputs(
        make_paged, contexts=(7, 20), query_len=1, page_size=16, dtype=dtype, pending=True
    )
    outputs = pagekernels.decoder_layer(**args, eps=EPS, rope_base=ROPE_BASE, stream=mx.gpu)
    counts = _primitive_counts(tmp_path, outputs)
    assert counts["DecoderLayer"] == 1
    assert not counts.keys() & {"Linear", "PagedAttention", "WriteKV", "NormRope", "Reshape"}


@pytest.mark.parametrize(
    "contexts, dtype",
    [((3,) * 17, mx.bfloat16), ((7, 20), mx.float32)],
    ids=["17-rows", "float32"],
)
def _test_a_gpu_decode_step_the_kernels_do_not_take_composes_the_ops(
    tmp_path, make_paged, contexts, dtype
):
    """More rows than the linear kernel takes, or float32: the separate ops, no DecoderLayer."""
    args = _layer_inputs(
        make_paged, contexts=contexts, query_len=1, page_size=16, dtype=dtype, pending=True
    )
    outputs = pagekernels.decoder_layer(**args, eps=EPS, rope_base=ROPE_BASE, stream=mx.gpu)
    counts = _primitive_counts(tmp_path, outputs)
    assert "DecoderLayer" not in counts
    assert counts["PagedAttention"] == counts["WriteKV"] == 1


if mx.cuda.is_available():
    test_a_gpu_decode_step_is_one_graph_node = _test_a_gpu_decode_step_is_one_graph_node
    test_a_gpu_decode_step_the_kernels_do_not_take_composes_the_ops = (
        _test_a_gpu_decode_step_the_kernels_do_not_take_composes_the_ops
    )


def test_cpu_streams_compose_the_other_ops(tmp_path, make_paged):
    args = _layer_inputs(
        make_paged, contexts=(7, 20), query_len=1, page_size=16, dtype=mx.bfloat16, pending=True
    )
    counts = _primitive_counts(
        tmp_path, pagekernels.decoder_layer(**args, eps=EPS, rope_base=ROPE_BASE, stream=mx.cpu)
    )
    assert "DecoderLayer" not in counts
    assert counts["PagedAttention"] == counts["WriteKV"] == 1
    assert counts["NormRope"] == counts["AddRMSNorm"] == 2


def test_compiled_equals_eager(device, make_paged):
    args = _layer_inputs(
        make_paged,
        contexts=(3, 18),
        query_len=1,
        page_size=8,
        dtype=mx.bfloat16,
        pending=True,
        seed=3,
    )
    tables = {k: v for k, v in args.items() if k != "page_size"}

    def layer(**arrays):
        return pagekernels.decoder_layer(
            **arrays, page_size=8, eps=EPS, rope_base=ROPE_BASE, stream=device
        )

    eager = layer(**_with_own_pages(tables))
    compiled = mx.compile(layer)(**_with_own_pages(tables))
    for a, b in zip(eager, compiled, strict=True):
        assert mx.array_equal(a, b, equal_nan=True).item()


def _valid_args(make_paged) -> dict:
    return _layer_inputs(
        make_paged, contexts=(5, 9), query_len=1, page_size=4, dtype=mx.float32, pending=True
    ) | {"eps": EPS, "rope_base": ROPE_BASE}


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a | {"residual": a["residual"][0]}, r"residual must have rank 3"),
        (
            lambda a: a | {"pending": a["pending"][:, :, :64]},
            r"pending must have the shape of residual",
        ),
        (lambda a: a | {"weights": a["weights"][:7]}, r"weights must hold the layer's 8 arrays"),
        (
            lambda a: a | {"weights": a["weights"]._replace(o_proj=a["weights"].o_proj.T)},
            r"weights\[4\] \(o_proj\) must have shape \(128, 256\)",
        ),
        (
            lambda a: a | {"weights": a["weights"]._replace(q_norm=a["weights"].q_norm[:32])},
            r"weights\[2\] \(q_norm\) must have shape \(64,\)",
        ),
        (
            lambda a: (
                a
                | {
                    "weights": a["weights"]._replace(
                        down_proj=a["weights"].down_proj.astype(mx.float16)
                    )
                }
            ),
            r"weights\[7\] \(down_proj\) must have residual's dtype",
        ),
        (
            lambda a: a | {"weights": a["weights"]._replace(qkv_proj=a["weights"].qkv_proj[:-1])},
            r"qkv_proj must stack Hq \* D query rows",
        ),
        (
            lambda a: (
                a | {"weights": a["weights"]._replace(gate_up_proj=a["weights"].gate_up_proj[:-1])}
            ),
            r"gate_up_proj must stack gate and up rows",
        ),
        (lambda a: a | {"slot_mapping": a["slot_mapping"][:1]}, r"slot_mapping must hold B \* L"),
        (lambda a: a | {"offsets": a["offsets"].astype(mx.int64)}, r"offsets must be int32"),
        (lambda a: a | {"page_size": 8}, r"key_pages.shape\[2\]=4"),
        (lambda a: a | {"eps": 0.0}, r"eps must be a finite positive number"),
        (lambda a: a | {"rope_base": float("inf")}, r"rope_base must be a finite positive number"),
    ],
    ids=[
        "residual-rank",
        "pending-shape",
        "weight-count",
        "o_proj-transposed",
        "q_norm-width",
        "weight-dtype",
        "qkv-rows",
        "gate_up-odd",
        "slots",
        "offsets-dtype",
        "page-size",
        "eps",
        "rope-base",
    ],
)
def test_rejects_bad_arguments(make_paged, assert_rejected, change, match):
    assert_rejected("decoder_layer", change(_valid_args(make_paged)), match)
