"""What one step does: chunked prefill under budget, one decode call, buckets, page release."""

from __future__ import annotations

import random

from structlog.testing import capture_logs

from pageruntime import SamplingParams
from pageruntime.testing import ContextHashModel, random_prompts, reference_output


def _calls_per_step(engine, model: ContextHashModel) -> list[list[tuple[int, int, int]]]:
    """Run the engine to completion; the model calls `(B, L, max_pages)` of every step."""
    steps = []
    while engine.has_unfinished():
        before = len(model.calls)
        engine.step()
        steps.append(model.calls[before:])
    return steps


def test_prefill_runs_in_chunks_and_decode_starts_the_next_step(make_sync_engine) -> None:
    model = ContextHashModel()
    engine = make_sync_engine(model, prefill_step=8)
    engine.add_request(list(range(20)), SamplingParams(max_new_tokens=3))
    steps = _calls_per_step(engine, model)
    # (B, L, max_pages): chunks of 8, 8, 4 (the last one samples the first token), then decode.
    assert steps == [
        [(1, 8, 2)],
        [(1, 8, 4)],
        [(1, 4, 8)],
        [(1, 1, 8)],
        [(1, 1, 8)],
    ]


def test_each_step_makes_one_decode_call_and_prefills_within_budget(make_sync_engine) -> None:
    model = ContextHashModel()
    engine = make_sync_engine(model, max_batch_size=4, prefill_step=8)
    rng = random.Random(2)
    for prompt in random_prompts(rng, 9, max_len=25):
        engine.add_request(prompt, SamplingParams(max_new_tokens=rng.randint(1, 12)))
    with capture_logs() as logs:
        steps = _calls_per_step(engine, model)
    chunks = [e for e in logs if e["event"] == "prefill_chunk"]
    assert sum(e["num_tokens"] for e in chunks) == engine.stats.prefill_tokens
    for step, calls in enumerate(steps):
        step_chunks = [e["num_tokens"] for e in chunks if e["step"] == step]
        assert sum(step_chunks) <= 8
        assert len(calls) - len(step_chunks) in (0, 1)  # at most one decode call
        for B, L, max_pages in calls:
            assert B in (1, 2, 4) and (B == 1 or L == 1)
            assert max_pages & (max_pages - 1) == 0  # a power of two


def test_decode_batches_are_padded_to_power_of_two_buckets(make_engine) -> None:
    model = ContextHashModel()
    engine = make_engine(model, max_batch_size=8, prefill_step=64)
    for n in range(5):
        engine.add_request([n + 1] * 5, SamplingParams(max_new_tokens=8 if n < 3 else 3))
    _calls_per_step(engine, model)
    decode_batch_sizes = {B for B, L, _ in model.calls if L == 1}
    # 5 rows run as a batch of 8, then the 3 longer requests as a batch of 4.
    assert decode_batch_sizes == {8, 4}


def test_decode_batch_width_is_capped_at_max_batch_size(make_engine) -> None:
    model = ContextHashModel()
    engine = make_engine(model, max_batch_size=3, prefill_step=64)
    engine.generate([[1, 2]] * 5, SamplingParams(max_new_tokens=5))
    assert max(B for B, _, _ in model.calls) == 3


def test_a_finished_request_frees_its_pages_and_its_slot_at_once(make_engine) -> None:
    engine = make_engine(max_batch_size=2, prefill_step=64)
    short = engine.add_request([1] * 6, SamplingParams(max_new_tokens=2))
    long = engine.add_request([2] * 6, SamplingParams(max_new_tokens=20))
    third = engine.add_request([3] * 6, SamplingParams(max_new_tokens=2))
    with capture_logs() as logs:
        events = engine.step() + engine.step()
        assert [e.request_id for e in events if e.finished] == [short]
        # Only the long request's 7 tokens (2 pages) are still held.
        assert engine.pool.num_live == 2
        engine.step()
    admitted = {e["request_id"]: e["step"] for e in logs if e["event"] == "request_admitted"}
    assert admitted == {short: 0, long: 0, third: 2}
    while engine.has_unfinished():
        engine.step()
    assert engine.pool.num_live == 0


def test_prefill_budget_is_shared_by_several_prompts_in_one_step(make_engine) -> None:
    model = ContextHashModel()
    engine = make_engine(model, max_batch_size=4, prefill_step=8)
    params = SamplingParams(max_new_tokens=2)
    for prompt in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
        engine.add_request(prompt, params)
    engine.step()
    # 3 + 2 tokens complete two prompts; the third gets the 3 tokens left of the budget.
    assert model.calls == [(1, 3, 1), (1, 2, 1), (1, 3, 1)]
    outputs = []
    while engine.has_unfinished():
        outputs += [e.token for e in engine.step() if e.request_id == 2]
    assert outputs == reference_output([6, 7, 8, 9], params, max_seq_len=256)[-len(outputs) :]
