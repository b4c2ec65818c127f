"""A request's own bookkeeping: finish reasons and token slices."""

from __future__ import annotations

import pytest

from pageruntime import FinishReason, SamplingParams
from pageruntime.request import Request


def _request(max_new_tokens: int = 5, stop=(), max_seq_len: int = 100) -> Request:
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop)
    return Request(3, (10, 11, 12), params, max_seq_len=max_seq_len)


def test_a_stop_token_wins_over_length_and_max_seq_len() -> None:
    request = _request(max_new_tokens=1, stop=(7,), max_seq_len=4)
    assert request.add_output(7) is FinishReason.STOP


def test_length_wins_over_max_seq_len() -> None:
    request = _request(max_new_tokens=1, max_seq_len=4)
    assert request.add_output(1) is FinishReason.LENGTH


def test_max_seq_len_counts_prompt_and_output() -> None:
    request = _request(max_new_tokens=10, max_seq_len=5)
    assert request.add_output(1) is None
    assert request.add_output(2) is FinishReason.MAX_SEQ_LEN
    assert request.num_tokens == 5


def test_token_ids_span_prompt_and_output() -> None:
    request = _request()
    request.add_output(20)
    request.add_output(21)
    assert request.token_ids(2, 5) == (12, 20, 21)
    assert request.num_computed == 0 and request.num_pages == 0


def test_output_needs_a_finished_request() -> None:
    with pytest.raises(RuntimeError, match="has not finished"):
        _request().output()
