"""Paged vs dense, end to end through `Qwen3Model.step`: token-by-token decode across page
boundaries, chunked prefill, and batched rows against each row alone (float32 tiny model)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

PROMPT = list(b"Pages!")
NUM_DECODE_STEPS = 14  # 6 + 14 = 20 tokens: five pages of 4


@pytest.mark.parametrize("mode", ["paged", "gather"])
def test_token_by_token_decode_matches_dense_baseline(
    make_tiny, make_driver, oracle, logprobs, mode: str
) -> None:
    model = make_tiny(mode)
    dense = make_driver(make_tiny("dense"), page_size=4)
    paged = make_driver(model, page_size=4)
    dense_row, paged_row = dense.new_row(), paged.new_row()
    tokens = list(PROMPT)
    new = tokens
    for _ in range(NUM_DECODE_STEPS + 1):
        got = logprobs(paged.step([paged_row], [new])[0])
        expected = logprobs(dense.step([dense_row], [new])[0])
        np.testing.assert_allclose(got, expected, atol=1e-4)
        np.testing.assert_allclose(got, logprobs(oracle(model, tokens)), atol=1e-4)
        new = [int(np.argmax(got))]
        tokens += new
    assert paged_row.context_len == len(tokens) - 1 == len(PROMPT) + NUM_DECODE_STEPS
    assert len(paged_row.page_ids) == 5


@pytest.mark.parametrize("mode", ["paged", "gather", "dense"])
def test_prefill_in_chunks_equals_one_call(
    make_tiny, make_driver, oracle, logprobs, mode: str
) -> None:
    model = make_tiny(mode)
    tokens = list(b"chunked prefill, crossing pages")
    whole = make_driver(model, page_size=4)
    one_call = logprobs(whole.step([whole.new_row()], [tokens])[0])
    chunked = make_driver(model, page_size=4)
    row = chunked.new_row()
    start = 0
    for size in (3, 5, 1, 8, 7, len(tokens) - 24):
        logits = chunked.step([row], [tokens[start : start + size]])[0]
        start += size
        np.testing.assert_allclose(
            logprobs(logits), logprobs(oracle(model, tokens[:start])), atol=1e-4
        )
    assert start == len(tokens)
    np.testing.assert_allclose(logprobs(logits), one_call, atol=1e-5)


@pytest.mark.parametrize("mode", ["paged", "gather", "dense"])
def test_batched_decode_rows_equal_each_row_alone(
    make_tiny, make_driver, logprobs, mode: str
) -> None:
    model = make_tiny(mode)
    prompts = [list(b"a short one"), list(b"x"), list(b"the longest prompt of the three")]
    batched = make_driver(model, page_size=4)
    rows = [batched.new_row() for _ in prompts]
    alone = [make_driver(model, page_size=4) for _ in prompts]
    alone_rows = [driver.new_row() for driver in alone]
    next_tokens = []
    for b, prompt in enumerate(prompts):  # prefill one request per call, as the engine does
        logits = batched.step([rows[b]], [prompt])[0]
        alone[b].step([alone_rows[b]], [prompt])
        next_tokens.append(int(mx.argmax(logits).item()))
    for _ in range(6):  # decode: 3 real rows + 1 padding row
        logits = batched.step([*rows, None], [[t] for t in next_tokens] + [[0]])
        for b, token in enumerate(next_tokens):
            solo = alone[b].step([alone_rows[b]], [[token]])[0]
            np.testing.assert_allclose(logprobs(logits[b]), logprobs(solo), atol=1e-5)
        next_tokens = [int(t) for t in mx.argmax(logits[:3], axis=-1).tolist()]
    assert not np.isnan(np.array(logits[:3])).any()


@settings(max_examples=12, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    page_size=st.sampled_from([1, 3, 4, 16]),
)
def test_any_chunking_and_page_size_equals_one_call(
    make_tiny, make_driver, oracle, logprobs, chunks: list[int], page_size: int
) -> None:
    model = make_tiny("paged")
    tokens = list(b"hypothesis picks the chunks and the page size")[: sum(chunks)]
    whole = make_driver(model, page_size=page_size, num_pages=64)
    one_call = logprobs(whole.step([whole.new_row()], [tokens], max_pages=64)[0])
    chunked = make_driver(model, page_size=page_size, num_pages=64)
    row, start = chunked.new_row(), 0
    for size in chunks:
        if start >= len(tokens):
            break
        logits = chunked.step([row], [tokens[start : start + size]], max_pages=64)[0]
        start += size
    np.testing.assert_allclose(logprobs(logits), one_call, atol=1e-5)
    np.testing.assert_allclose(one_call, logprobs(oracle(model, tokens)), atol=1e-4)
