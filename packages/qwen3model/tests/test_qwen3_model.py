"""Qwen3Model: the network against a readable numpy Qwen3, and the step contract."""

from __future__ import annotations

import collections

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from pagekernels import get_backend
from pagepool import BatchMetadata, KVStorage, PageList, PagePool
from qwen3model import (
    AttentionMode,
    DenseKVStore,
    QuantizationArgs,
    Qwen3Model,
    build_synthetic,
)

PROMPT = list(b"Paged attention reads K/V through a block table.")


@pytest.mark.parametrize("mode", list(AttentionMode))
def test_prefill_matches_numpy_qwen3(backend, prefill, numpy_qwen3, mode: AttentionMode) -> None:
    model, _ = build_synthetic("qwen3-tiny", backend=backend, attention_mode=mode)
    logits = numpy_qwen3(model.checkpoint_weights(), PROMPT, model.args)
    expected = mx.array(logits[-1], dtype=mx.float32)
    got = prefill(model, PROMPT, page_size=8)
    np.testing.assert_allclose(nn.log_softmax(got), nn.log_softmax(expected), atol=1e-4)


def test_bfloat16_prefill_is_close_to_float32(backend, prefill) -> None:
    f32, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32)
    bf16, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=mx.bfloat16)
    assert bf16.dtype == mx.bfloat16
    expected = nn.log_softmax(prefill(f32, PROMPT))
    got = nn.log_softmax(prefill(bf16, PROMPT))
    np.testing.assert_allclose(got, expected, atol=5e-2)


def test_synthetic_weights_are_seeded(backend) -> None:
    a, _ = build_synthetic("qwen3-tiny", backend=backend, seed=1)
    b, _ = build_synthetic("qwen3-tiny", backend=backend, seed=1)
    c, _ = build_synthetic("qwen3-tiny", backend=backend, seed=2)
    name = "model.layers.1.mlp.up_proj.weight"
    weights = [m.checkpoint_weights()[name] for m in (a, b, c)]
    assert mx.array_equal(weights[0], weights[1]).item()
    assert not mx.array_equal(weights[0], weights[2]).item()
    assert float(weights[0].std()) == pytest.approx(64**-0.5, rel=0.1)
    embedding = a.model.embed_tokens.weight
    assert float(embedding.std()) == pytest.approx(0.02, rel=0.1)
    assert mx.array_equal(a.model.norm.weight, mx.ones((64,))).item()


def _one_row(pool: PagePool, num_tokens: int) -> tuple[BatchMetadata, PageList]:
    pages = PageList(pool)
    pages.append(num_tokens)
    return BatchMetadata.build([pages], query_len=num_tokens), pages


def test_step_rejects_tokens_that_do_not_match_metadata(tiny) -> None:
    model, _ = tiny
    pool = PagePool(4, 8)
    kv = model.make_kv_storage(pool)
    metadata, _ = _one_row(pool, 3)
    with pytest.raises(ValueError, match=r"expected \(1, 3\)"):
        model.step(mx.zeros((1, 2), dtype=mx.int32), metadata, kv)


def test_dense_cache_given_to_paged_model_is_an_error(backend) -> None:
    paged, _ = build_synthetic("qwen3-tiny", backend=backend)
    dense, _ = build_synthetic("qwen3-tiny", backend=backend, attention_mode="dense")
    pool = PagePool(4, 8)
    dense_kv, paged_kv = dense.make_kv_storage(pool), paged.make_kv_storage(pool)
    assert isinstance(dense_kv, DenseKVStore) and type(paged_kv) is KVStorage
    metadata, _ = _one_row(pool, 3)
    tokens = mx.zeros((1, 3), dtype=mx.int32)
    with pytest.raises(TypeError, match="needs page storage"):
        paged.step(tokens, metadata, dense_kv)
    with pytest.raises(TypeError, match="DenseKVStore"):
        dense.step(tokens, metadata, paged_kv)
    paged.compile_decode = True
    decode, _ = _one_row(pool, 1)
    with pytest.raises(TypeError, match="needs page storage"):
        paged.step(mx.zeros((1, 1), dtype=mx.int32), decode, dense_kv)


def test_max_seq_len_is_bounded_by_the_config(backend) -> None:
    model, _ = build_synthetic("qwen3-tiny", backend=backend, max_seq_len=100)
    assert model.max_seq_len == 100
    with pytest.raises(ValueError, match="max_seq_len"):
        build_synthetic("qwen3-tiny", backend=backend, max_seq_len=10_000)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_compiled_decode_equals_eager(backend, dtype) -> None:
    """Exact in float32; in bfloat16 (where a GPU runs the `linear` kernel inside the trace, its
    graph replayed as the batch changes) fused elementwise ops may round differently."""
    eager, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=dtype)
    compiled, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=dtype)
    compiled.compile_decode = True
    runs = []
    for model in (eager, compiled):
        pool = PagePool(4, 32)
        kv = model.make_kv_storage(pool, fill_value=float("nan"))
        rows = [PageList(pool) for _ in range(3)]
        logits = []
        for b, row in enumerate(rows):
            prompt = PROMPT[: 5 + 4 * b]
            row.append(len(prompt))
            model.step(mx.array([prompt]), BatchMetadata.build([row], query_len=len(prompt)), kv)
        for step, (batch, width) in enumerate([(2, 4), (2, 4), (3, 8), (3, 8), (3, 8)]):
            live = rows[:batch] + [None] * (4 - batch if batch > 2 else 0)
            for row in rows[:batch]:
                row.append(1)
            metadata = BatchMetadata.build(live, query_len=1, max_pages=width)
            tokens = mx.array([[step + b] for b in range(len(live))], dtype=mx.int32)
            logits.append(model.step(tokens, metadata, kv))
            mx.eval(logits[-1], kv.keys, kv.values)
        runs.append((logits, kv))
    (eager_logits, eager_kv), (compiled_logits, compiled_kv) = runs
    for a, b in zip(eager_logits, compiled_logits, strict=True):
        if dtype == mx.float32:
            assert mx.array_equal(a, b).item()
        else:
            scale = mx.abs(a).max().item()
            np.testing.assert_allclose(np.array(b), np.array(a), rtol=0, atol=0.03 * scale)
    eager_pages = eager_kv.keys + eager_kv.values
    for a, b in zip(eager_pages, compiled_kv.keys + compiled_kv.values, strict=True):
        if dtype == mx.float32:
            assert mx.array_equal(a, b, equal_nan=True).item()
        else:
            np.testing.assert_allclose(
                np.array(b.astype(mx.float32)), np.array(a.astype(mx.float32)), atol=0.1
            )
    assert list(compiled._compiled_decode._functions) == [4]  # the compiled path ran


def _prompt_then_decode(model: Qwen3Model, *, compiled: bool) -> mx.array:
    """Prefills `PROMPT` on fresh NaN-poisoned pages, then decodes one token; its logits."""
    model.compile_decode = compiled
    pool = PagePool(4, 32)
    kv = model.make_kv_storage(pool, fill_value=float("nan"))
    row = PageList(pool)
    row.append(len(PROMPT))
    model.step(mx.array([PROMPT]), BatchMetadata.build([row], query_len=len(PROMPT)), kv)
    row.append(1)
    metadata = BatchMetadata.build([row], query_len=1, max_pages=16)
    logits = model.step(mx.array([[7]], dtype=mx.int32), metadata, kv)
    mx.eval(logits)
    return logits


def test_compiled_decode_uses_the_current_weights(backend) -> None:
    model, _ = build_synthetic("qwen3-tiny", backend=backend)
    before = _prompt_then_decode(model, compiled=True)  # traces the decode step
    name = "model.layers.0.mlp.gate_up_proj.weight"
    weight = dict(tree_flatten(model.parameters()))[name]
    model.load_weights([(name, -weight)], strict=False)
    compiled = _prompt_then_decode(model, compiled=True)
    assert not mx.array_equal(compiled, before).item()  # the new weight reached the trace
    assert mx.array_equal(compiled, _prompt_then_decode(model, compiled=False)).item()
    # A weight assigned directly (no `update`) reaches the existing trace too.
    model.model.layers[1].self_attn.o_proj.weight = (
        2 * model.model.layers[1].self_attn.o_proj.weight
    )
    compiled = _prompt_then_decode(model, compiled=True)
    assert mx.array_equal(compiled, _prompt_then_decode(model, compiled=False)).item()


def test_compiled_decode_after_quantize_equals_eager(backend) -> None:
    model, _ = build_synthetic("qwen3-tiny", backend=backend)
    float_logits = _prompt_then_decode(model, compiled=True)
    model.quantize(QuantizationArgs(group_size=64, bits=4))
    assert not model._compiled_decode._functions  # the float traces are dropped
    compiled = _prompt_then_decode(model, compiled=True)
    assert not mx.array_equal(compiled, float_logits).item()
    assert mx.array_equal(compiled, _prompt_then_decode(model, compiled=False)).item()


def test_vocab_size_is_the_configs(backend) -> None:
    model, _ = build_synthetic("qwen3-tiny", backend=backend)
    assert model.vocab_size == model.args.vocab_size
    assert _prompt_then_decode(model, compiled=False).shape == (1, model.vocab_size)


class _CountingBackend:
    """A kernel backend that counts calls per op and delegates everything to `inner`."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = "counting"
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        op = getattr(self.inner, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return op(*args, **kwargs)

        return counted


def _count_backend_calls(
    mode: AttentionMode, *, quantize: bool = False
) -> tuple[collections.Counter[str], int]:
    """The backend ops one 3-token prefill step of qwen3-tiny calls, by name, and its layer
    count."""
    counting = _CountingBackend(get_backend("reference"))
    model, _ = build_synthetic("qwen3-tiny", backend=counting, attention_mode=mode)
    if quantize:
        model.quantize(QuantizationArgs(group_size=64, bits=4))
    pool = PagePool(4, 8)
    kv = model.make_kv_storage(pool)
    row = PageList(pool)
    row.append(3)
    mx.eval(model.step(mx.array([PROMPT[:3]]), BatchMetadata.build([row], query_len=3), kv))
    return counting.calls, model.args.num_hidden_layers


def test_paged_blocks_run_as_one_decoder_layer_op_each() -> None:
    calls, layers = _count_backend_calls(AttentionMode.PAGED)
    assert calls["decoder_layer"] == layers
    assert calls["linear"] == 1  # the LM head
    assert calls["add_rms_norm"] == 1  # the last block's MLP output with the final norm
    assert calls["split_linear"] == calls["norm_rope"] == calls["paged_attention"] == 0


def test_every_projection_and_the_lm_head_go_through_the_backend() -> None:
    # The gather ablation runs the separate ops (as quantized paged blocks do).
    calls, layers = _count_backend_calls(AttentionMode.GATHER)
    assert calls["decoder_layer"] == 0
    # o and down per layer, then the LM head (tied or not); q/k/v and gate/up stacked.
    assert calls["linear"] == 2 * layers + 1
    assert calls["split_linear"] == 2 * layers
    # Every residual add with the norm after it: two per block, the last one the final norm.
    assert calls["add_rms_norm"] == 2 * layers
    assert calls["norm_rope"] == 2 * layers  # queries and keys


def test_quantized_paged_blocks_run_the_separate_ops() -> None:
    calls, layers = _count_backend_calls(AttentionMode.PAGED, quantize=True)
    assert calls["decoder_layer"] == 0
    assert calls["paged_attention"] == calls["write_kv"] == layers
