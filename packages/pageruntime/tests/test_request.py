"""A request's own bookkeeping: finish reasons, token slices and pending output tokens."""

from __future__ import annotations

import pytest

from pageruntime import FinishReason, SamplingParams
from pageruntime.request import PENDING_TOKEN, Request, RequestState


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


@pytest.mark.parametrize(
    ("max_new_tokens", "max_seq_len", "outputs", "last"),
    [(3, 100, 1, False), (3, 100, 2, True), (10, 6, 1, False), (10, 6, 2, True)],
    ids=["room", "length", "seq-room", "max-seq-len"],
)
def test_next_token_is_last_by_length_or_max_seq_len(
    max_new_tokens: int, max_seq_len: int, outputs: int, last: bool
) -> None:
    request = _request(max_new_tokens=max_new_tokens, max_seq_len=max_seq_len)
    for token in range(outputs):
        assert request.add_output(token) is None
    assert request.next_token_is_last is last
    reason = request.add_output(99)
    assert (reason is not None) is last


def test_a_pending_output_holds_the_next_slot_until_dropped() -> None:
    request = _request()
    request.state = RequestState.DECODE
    request.add_output(20)
    request.add_pending_output()
    assert request.has_pending_output and request.num_tokens == 5
    assert request.output_ids == [20, PENDING_TOKEN]
    with pytest.raises(RuntimeError, match="cannot take a pending output token"):
        request.add_pending_output()
    request.drop_pending_output()
    assert request.output_ids == [20] and not request.has_pending_output
    request.drop_pending_output()  # nothing pending: no change
    assert request.output_ids == [20]


def test_only_a_decoding_request_takes_a_pending_output() -> None:
    request = _request()
    for state in (RequestState.WAITING, RequestState.PREFILL, RequestState.FINISHED):
        request.state = state
        with pytest.raises(RuntimeError, match=f"\\({state}\\) cannot take a pending"):
            request.add_pending_output()
    assert request.output_ids == []
