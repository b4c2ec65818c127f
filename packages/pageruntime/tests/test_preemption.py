"""Optimistic admission: preemption, recomputation, and requests that outgrow the pool."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from pageruntime import FinishReason, KVCapacityExceeded, SamplingParams
from pageruntime.testing import reference_output

PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]
GREEDY = SamplingParams(max_new_tokens=12)
SAMPLED = SamplingParams(max_new_tokens=12, temperature=0.8, seed=5)


def test_preempted_requests_end_as_if_never_interrupted(make_engine) -> None:
    # 3 requests of up to 17 K/V tokens (5 pages of 4) share 6 pages: decode must preempt.
    engine = make_engine(num_pages=6, max_batch_size=3, admission="optimistic")
    params = [GREEDY, SAMPLED, GREEDY]
    with capture_logs() as logs:
        outputs = engine.generate(PROMPTS, params)
    preempted = [e for e in logs if e["event"] == "request_preempted"]
    assert engine.stats.preemptions == len(preempted) > 0
    assert sum(output.num_preemptions for output in outputs) == len(preempted)
    # The most recently admitted request goes first.
    assert preempted[0]["request_id"] == 2
    for prompt, p, output in zip(PROMPTS, params, outputs, strict=True):
        [alone] = make_engine().generate([prompt], p)
        assert output.output_ids == alone.output_ids
        assert output.finish_reason is FinishReason.LENGTH
    assert outputs[0].output_ids == tuple(reference_output(PROMPTS[0], GREEDY, max_seq_len=256))
    resumed = [e for e in logs if e["event"] == "request_admitted" and e["resumed"]]
    assert len(resumed) == len(preempted)
    # A fixed pool cannot hold more than its pages; overfilling it would fail a request.
    assert engine.pool.num_live == 0 and engine.stats.requests_failed == 0


def test_a_resumed_request_recomputes_its_prompt_and_output(make_engine) -> None:
    engine = make_engine(num_pages=6, max_batch_size=3, admission="optimistic")
    with capture_logs() as logs:
        engine.generate(PROMPTS, GREEDY)
    preempted = next(e for e in logs if e["event"] == "request_preempted")
    resumed = next(
        e
        for e in logs
        if e["event"] == "request_admitted"
        and e["resumed"]
        and e["request_id"] == preempted["request_id"]
    )
    # It comes back with every token it had: the prompt plus all output so far.
    assert resumed["num_tokens"] == preempted["num_tokens"]
    assert engine.stats.prefill_tokens > sum(len(p) for p in PROMPTS)


def test_reserve_admission_never_preempts(make_engine) -> None:
    engine = make_engine(num_pages=6, max_batch_size=3, admission="reserve")
    with capture_logs() as logs:
        outputs = engine.generate(PROMPTS, GREEDY)
    assert engine.stats.preemptions == 0
    assert not [e for e in logs if e["event"] == "request_preempted"]
    # One 5-page reservation fits in 6 pages at a time.
    assert engine.stats.peak_live_pages <= 5
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert list(output.output_ids) == reference_output(prompt, GREEDY, max_seq_len=256)


def test_a_request_that_outgrows_the_whole_pool_fails_explicitly(make_engine) -> None:
    engine = make_engine(num_pages=4, admission="optimistic")
    prompt = [3, 1, 4, 1, 5, 9]
    [output] = engine.generate([prompt], SamplingParams(max_new_tokens=30))
    assert output.finish_reason is FinishReason.FAILED
    assert isinstance(output.error, KVCapacityExceeded)
    assert output.error.num_pages_needed == 5 and output.error.capacity == 4
    # 16 slots hold the prompt and 10 fed-back tokens: the 11th token is the last one.
    free_run = reference_output(prompt, SamplingParams(max_new_tokens=30), max_seq_len=256)
    assert list(output.output_ids) == free_run[:11]
    assert engine.pool.num_live == 0 and engine.stats.requests_failed == 1


def test_an_outgrown_request_fails_on_readmission_while_others_finish(make_engine) -> None:
    engine = make_engine(num_pages=6, max_batch_size=2, admission="optimistic")
    small = SamplingParams(max_new_tokens=4)
    big = SamplingParams(max_new_tokens=40)
    outputs = engine.generate([[1, 2], [3, 4, 5, 6, 7, 8]], [small, big])
    assert list(outputs[0].output_ids) == reference_output([1, 2], small, max_seq_len=256)
    assert outputs[1].finish_reason is FinishReason.FAILED
    assert isinstance(outputs[1].error, KVCapacityExceeded)
    assert engine.pool.num_live == 0


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
def test_admission_never_overfills_the_pool(make_engine, admission: str) -> None:
    engine = make_engine(num_pages=7, max_batch_size=4, admission=admission)
    prompts = [[n] * (3 + 2 * n) for n in range(8)]
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=9))
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference_output(prompt, SamplingParams(max_new_tokens=9), max_seq_len=256)
        assert list(output.output_ids) == expected
    # A fixed pool cannot hold more than its pages; overfilling it would fail a request.
    assert engine.stats.requests_failed == 0 and engine.pool.num_live == 0
