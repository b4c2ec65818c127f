"""Sampling parameters and the default sampler."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from pageruntime import SamplingParams, sample_tokens, token_key

V = 12


def _logits(B: int = 1, seed: int = 0) -> mx.array:
    return mx.random.normal((B, V), key=mx.random.key(seed)) * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.0), "max_new_tokens"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(stop_token_ids=[1, -2]), "stop_token_ids"),
        (dict(stop_token_ids="ab"), "stop_token_ids"),
        (dict(stop_token_ids=[1.0]), "stop_token_ids"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**64), "seed"),
    ],
    ids=[
        "zero-max-new-tokens",
        "float-max-new-tokens",
        "bool-max-new-tokens",
        "negative-temperature",
        "infinite-temperature",
        "nan-temperature",
        "string-temperature",
        "zero-top-p",
        "top-p-above-one",
        "negative-top-k",
        "negative-stop-token",
        "string-stop-tokens",
        "float-stop-token",
        "negative-seed",
        "seed-too-large",
    ],
)
def test_sampling_params_reject_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation() -> None:
    params = SamplingParams(stop_token_ids=[3, 5], seed=2**64 - 1)
    assert params.greedy
    assert params.stop_token_ids == (3, 5)
    assert params.max_new_tokens == 16
    assert not SamplingParams(temperature=0.5).greedy
    with pytest.raises(AttributeError):
        params.temperature = 1.0  # type: ignore[misc]


def test_greedy_rows_take_the_argmax() -> None:
    logits = _logits(B=5)
    tokens = sample_tokens(logits, [SamplingParams()] * 5, [0] * 5)
    assert tokens.dtype == mx.int32
    assert tokens.tolist() == mx.argmax(logits, axis=-1).tolist()


def test_greedy_rows_ignore_sampled_rows_beside_them() -> None:
    logits = _logits(B=3, seed=1)
    params = [SamplingParams(), SamplingParams(temperature=2.0, seed=4), SamplingParams()]
    tokens = sample_tokens(logits, params, [0, 0, 0]).tolist()
    argmax = mx.argmax(logits, axis=-1).tolist()
    assert tokens[0] == argmax[0] and tokens[2] == argmax[2]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=3.0, top_k=1),
        SamplingParams(temperature=3.0, top_p=1e-6),
        SamplingParams(temperature=1e-30),  # logits / T overflow float32 unless shifted first
        SamplingParams(temperature=1e-40),  # a subnormal in float32
        SamplingParams(temperature=1e-300),  # zero in float32
    ],
    ids=["top-k-1", "tiny-top-p", "tiny-temperature", "subnormal-temperature", "zero-in-float32"],
)
def test_a_one_token_choice_equals_greedy(params: SamplingParams) -> None:
    logits = _logits(B=4, seed=2)
    for index in range(10):
        tokens = sample_tokens(logits, [params] * 4, [index] * 4)
        assert tokens.tolist() == mx.argmax(logits, axis=-1).tolist()


def _frequencies(logits: mx.array, params: SamplingParams, n: int = 3000) -> list[float]:
    """Empirical token frequencies of one row over `n` token indices."""
    rows = mx.broadcast_to(logits, (n, V))
    tokens = sample_tokens(rows, [params] * n, list(range(n))).tolist()
    return [tokens.count(v) / n for v in range(V)]


def test_temperature_sampling_follows_the_softmax() -> None:
    logits = _logits(seed=3)
    params = SamplingParams(temperature=1.5, seed=11)
    expected = mx.softmax(logits[0] / 1.5).tolist()
    observed = _frequencies(logits, params)
    assert max(abs(o - e) for o, e in zip(observed, expected, strict=True)) < 0.03


def test_top_k_keeps_exactly_the_k_most_likely_tokens() -> None:
    logits = _logits(seed=4)
    order = mx.argsort(-logits[0]).tolist()
    observed = _frequencies(logits, SamplingParams(temperature=5.0, top_k=3, seed=1))
    assert {v for v in range(V) if observed[v] > 0} == set(order[:3])
    # Within the kept set, the renormalised softmax.
    kept = mx.softmax(logits[0, mx.array(order[:3])] / 5.0).tolist()
    assert max(abs(observed[v] - p) for v, p in zip(order[:3], kept, strict=True)) < 0.03


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = _logits(seed=5)
    probs = mx.softmax(logits[0] / 3.0).tolist()
    order = sorted(range(V), key=lambda v: -probs[v])
    nucleus, mass = [], 0.0
    for v in order:
        nucleus.append(v)
        mass += probs[v]
        if mass >= 0.7:
            break
    assert 1 < len(nucleus) < V
    observed = _frequencies(logits, SamplingParams(temperature=3.0, top_p=0.7, seed=2))
    assert {v for v in range(V) if observed[v] > 0} == set(nucleus)


def test_top_k_and_top_p_combine() -> None:
    logits = _logits(seed=6)
    order = mx.argsort(-logits[0]).tolist()
    observed = _frequencies(logits, SamplingParams(temperature=50.0, top_k=4, top_p=0.5, seed=3))
    # At temperature 50 the top 4 are nearly uniform, so top-p 0.5 keeps 2 of them.
    assert {v for v in range(V) if observed[v] > 0} == set(order[:2])


def test_a_row_samples_the_same_token_in_any_batch() -> None:
    logits = _logits(B=4, seed=7)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (10, 20, 30, 40)]
    together = sample_tokens(logits, params, [5, 6, 7, 8]).tolist()
    for b in range(4):
        alone = sample_tokens(logits[b : b + 1], [params[b]], [5 + b]).tolist()
        assert alone == [together[b]]
    reversed_rows = sample_tokens(logits[::-1], params[::-1], [8, 7, 6, 5]).tolist()
    assert reversed_rows == together[::-1]


def test_token_keys_differ_by_seed_and_index_and_repeat() -> None:
    keys = {tuple(token_key(seed, index).tolist()) for seed in range(4) for index in range(50)}
    assert len(keys) == 200
    assert token_key(7, 3).tolist() == token_key(7, 3).tolist()
    assert token_key(7, 3).dtype == mx.uint32


@pytest.mark.parametrize(
    ("shape", "num_params"),
    [((2, V), 3), ((V,), 1), ((1, 2, V), 1)],
    ids=["too-few-rows", "one-dimensional", "three-dimensional"],
)
def test_sample_tokens_rejects_mismatched_shapes(shape: tuple, num_params: int) -> None:
    with pytest.raises(ValueError, match="shape"):
        sample_tokens(mx.zeros(shape), [SamplingParams()] * num_params, [0] * num_params)
