"""Randomized soak: hundreds of requests through a small fixed pool under both policies.

Requests arrive while the engine runs, some are aborted, prompts and outputs have random
lengths, a third sample with temperature. Every request must end with exactly the tokens it
produces alone, and the pool must end empty.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from pageruntime import AdmissionPolicy, Engine, FinishReason, SamplingParams
from pageruntime.testing import VOCAB_SIZE, ContextHashModel, reference_output

NUM_REQUESTS = 300
MAX_SEQ_LEN = 96
# Small pools: the largest reservation (63 K/V tokens) fills most of either one.
POOLS = {
    "24x4-batch6": dict(num_pages=24, page_size=4, max_batch_size=6, prefill_step=16),
    "22x3-batch5": dict(num_pages=22, page_size=3, max_batch_size=5, prefill_step=7),
}


@dataclass(frozen=True)
class Job:
    prompt: list[int]
    params: SamplingParams
    arrival_step: int
    abort_after: int | None  # tokens received before aborting, or None


def _random_jobs(seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs, arrival = [], 0
    for _ in range(NUM_REQUESTS):
        arrival += rng.choice([0, 0, 1, 1, 2, 5])
        sampled = rng.random() < 1 / 3
        params = SamplingParams(
            max_new_tokens=rng.randint(1, 24),
            temperature=rng.choice([0.5, 1.0, 2.0]) if sampled else 0.0,
            top_k=rng.choice([0, 5, 20]),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            stop_token_ids=rng.sample(range(VOCAB_SIZE), rng.choice([0, 0, 1, 3])),
            seed=rng.randrange(2**32),
        )
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, 40))]
        abort_after = rng.randint(0, 4) if rng.random() < 0.05 else None
        jobs.append(Job(prompt, params, arrival, abort_after))
    return jobs


JOBS = _random_jobs(seed=2026)


@pytest.fixture(scope="module")
def solo_outputs() -> list[tuple[tuple[int, ...], FinishReason]]:
    """Every job run alone on a large pool (tokens and finish reason)."""
    engine = Engine(ContextHashModel(max_seq_len=MAX_SEQ_LEN), num_pages=64, page_size=4)
    results = []
    for job in JOBS:
        [output] = engine.generate([job.prompt], job.params)
        results.append((output.output_ids, output.finish_reason))
    return results


def test_solo_runs_match_the_python_oracle(solo_outputs) -> None:
    for job, (tokens, _) in zip(JOBS, solo_outputs, strict=True):
        if job.params.greedy:
            expected = reference_output(job.prompt, job.params, max_seq_len=MAX_SEQ_LEN)
            assert list(tokens) == expected


@pytest.mark.parametrize("pool", POOLS.values(), ids=POOLS.keys())
@pytest.mark.parametrize("admission", list(AdmissionPolicy))
def test_soak_every_request_ends_as_it_does_alone(solo_outputs, admission, pool) -> None:
    engine = Engine(ContextHashModel(max_seq_len=MAX_SEQ_LEN), admission=admission, **pool)
    tokens: dict[int, list[int]] = {}
    reasons: dict[int, FinishReason] = {}
    request_ids: list[int] = []
    step = 0
    while len(request_ids) < len(JOBS) or engine.has_unfinished():
        while len(request_ids) < len(JOBS) and JOBS[len(request_ids)].arrival_step <= step:
            job = JOBS[len(request_ids)]
            request_ids.append(engine.add_request(job.prompt, job.params))
            tokens[request_ids[-1]] = []
        for event in engine.step():
            assert event.request_id not in reasons, "an event after the end"
            if event.token is not None:
                tokens[event.request_id].append(event.token)
            if event.finished:
                reasons[event.request_id] = event.finish_reason
        for request_id, job in zip(request_ids, JOBS, strict=False):
            due = job.abort_after is not None and len(tokens[request_id]) >= job.abort_after
            if due and request_id not in reasons:
                assert engine.abort(request_id)
        step += 1
    assert sorted(reasons) == request_ids == list(range(len(JOBS)))
    for request_id, (solo_tokens, solo_reason) in zip(request_ids, solo_outputs, strict=True):
        if reasons[request_id] is FinishReason.ABORTED:
            assert tuple(tokens[request_id]) == solo_tokens[: len(tokens[request_id])]
        else:
            assert (tuple(tokens[request_id]), reasons[request_id]) == (solo_tokens, solo_reason)
    stats = engine.stats
    assert stats.pool.num_live_pages == 0 and stats.pool.num_free_pages == pool["num_pages"]
    assert stats.requests_failed == 0
    assert stats.requests_finished + stats.requests_aborted == len(JOBS)
    assert stats.requests_aborted == sum(r is FinishReason.ABORTED for r in reasons.values()) > 0
    if admission is AdmissionPolicy.OPTIMISTIC:
        assert stats.preemptions > 10
    else:
        assert stats.preemptions == 0
