"""`overlap_decode`: the next decode step is launched before this one is collected.

The rest of the suite runs every engine test in both modes (`make_engine`); these tests check
what only the overlapped mode does: when it launches ahead, what it discards, and that a
failure drops the step launched on top of the failed one.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from structlog.testing import capture_logs

from pageruntime import Engine, FinishReason, SamplingParams
from pageruntime.request import PENDING_TOKEN
from pageruntime.scheduler import Scheduler
from pageruntime.testing import (
    VOCAB_SIZE,
    ContextHashModel,
    FailingModel,
    context_hash,
    random_prompts,
    reference_output,
)


def _engine(model: ContextHashModel, *, overlap: bool, **kwargs: object) -> Engine:
    options: dict[str, object] = dict(num_pages=64, page_size=4, prefill_step=8)
    return Engine(model, overlap_decode=overlap, **{**options, **kwargs})


def _assert_pool_empty(engine: Engine) -> None:
    pool = engine.pool
    assert pool.num_live == 0 and pool.num_free == pool.capacity


def test_decode_steps_are_launched_one_step_ahead() -> None:
    params = SamplingParams(max_new_tokens=10)
    models = {overlap: ContextHashModel() for overlap in (False, True)}
    engines = {overlap: _engine(models[overlap], overlap=overlap) for overlap in (False, True)}
    ids = {overlap: engines[overlap].add_request([5, 6, 7], params) for overlap in (False, True)}
    tokens: dict[bool, list[int]] = {False: [], True: []}
    ahead = []
    while engines[False].has_unfinished():
        for overlap, engine in engines.items():
            tokens[overlap] += [e.token for e in engine.step() if e.request_id == ids[overlap]]
        ahead.append(len(models[True].calls) - len(models[False].calls))
    assert tokens[True] == tokens[False] == reference_output([5, 6, 7], params, max_seq_len=256)
    # Prefill (1 step), then decode steps with one call in flight, except at the step whose
    # token is the last: nothing is launched past the end of a request.
    assert ahead == [0] + [1] * 8 + [0]
    assert all(L == 1 for _, L, _ in models[True].calls[1:])
    _assert_pool_empty(engines[True])


def test_a_stop_token_discards_the_row_computed_past_it() -> None:
    prompt = [3, 1, 4]
    reference = reference_output(prompt, SamplingParams(max_new_tokens=20), max_seq_len=256)
    stop = reference[4]
    assert stop not in reference[:4] and context_hash(prompt) != stop
    params = SamplingParams(max_new_tokens=20, stop_token_ids=(stop,))
    model = ContextHashModel()
    engine = _engine(model, overlap=True)
    [output] = engine.generate([prompt], params)
    assert list(output.output_ids) == reference[:5] and output.finish_reason is FinishReason.STOP
    # 1 prefill call, 4 decode calls for tokens 2..5, 1 more launched before token 5 was seen.
    assert len(model.calls) == 6
    _assert_pool_empty(engine)
    # The discarded row wrote into a page that was freed: later requests are still exact.
    [again] = engine.generate([[9, 9, 2, 6]], SamplingParams(max_new_tokens=7))
    assert list(again.output_ids) == reference_output(
        [9, 9, 2, 6], SamplingParams(max_new_tokens=7), max_seq_len=256
    )


def test_admissions_happen_at_the_same_steps_as_without_overlap() -> None:
    params = [SamplingParams(max_new_tokens=n) for n in (3, 9, 5, 4, 7)]
    prompts = [[n, n + 1, n + 2] for n in range(5)]
    admitted = {}
    for overlap in (False, True):
        engine = _engine(ContextHashModel(), overlap=overlap, max_batch_size=2)
        with capture_logs() as logs:
            outputs = engine.generate(prompts, params)
        admitted[overlap] = [e["step"] for e in logs if e["event"] == "request_admitted"]
        for prompt, p, output in zip(prompts, params, outputs, strict=True):
            assert list(output.output_ids) == reference_output(prompt, p, max_seq_len=256)
    assert admitted[True] == admitted[False]


def test_abort_while_a_step_is_in_flight_reports_no_token_for_it() -> None:
    model = ContextHashModel()
    engine = _engine(model, overlap=True, max_batch_size=2)
    params = SamplingParams(max_new_tokens=12)
    kept = engine.add_request([1, 2, 3], params)
    aborted = engine.add_request([4, 5, 6], params)
    while len(model.calls) < 4:  # both prefilled, then decode steps in flight
        engine.step()
    calls = len(model.calls)
    assert engine.abort(aborted)
    events = engine.step()
    assert [(e.token, e.finish_reason) for e in events if e.request_id == aborted] == [
        (None, FinishReason.ABORTED)
    ]
    assert len(model.calls) == calls  # a row of the aborted request was in flight: no launch
    outputs = [e.token for e in events if e.request_id == kept]
    while engine.has_unfinished():
        outputs += [e.token for e in engine.step() if e.request_id == kept]
    assert outputs == reference_output([1, 2, 3], params, max_seq_len=256)[-len(outputs) :]
    _assert_pool_empty(engine)


def test_a_step_that_fails_at_evaluation_drops_the_step_launched_on_it() -> None:
    # The decode call at context length 6 fails when evaluated, after the next was launched
    # (MLX raises the failure when that next step is submitted).
    fired: list[bool] = []

    def first_call_at_context_6(md) -> bool:
        if fired or not (md.query_len == 1 and 6 in md.context_lens_host):
            return False
        fired.append(True)
        return True

    model = FailingModel(first_call_at_context_6, lazy=True)
    engine = _engine(model, overlap=True)
    params = SamplingParams(max_new_tokens=8)
    failed = engine.add_request([1, 2, 3], params)
    events = []
    while engine.has_unfinished():
        events += engine.step()
    assert [e.finish_reason for e in events if e.finished] == [FinishReason.FAILED]
    # Tokens 1-3 come from context lengths 3-5. MLX reports the failure at whichever
    # synchronisation comes next, so it may fail the step before the failing one too.
    tokens = [e.token for e in events if e.request_id == failed and not e.finished]
    assert len(tokens) in (2, 3)
    assert tokens == reference_output([1, 2, 3], params, max_seq_len=256)[: len(tokens)]
    _assert_pool_empty(engine)
    # Storage is back to its state before the failed step: a new request is exact.
    [output] = engine.generate([[7, 7]], SamplingParams(max_new_tokens=9))
    assert list(output.output_ids) == reference_output(
        [7, 7], SamplingParams(max_new_tokens=9), max_seq_len=256
    )


def test_overlap_needs_reserve_admission() -> None:
    with pytest.raises(ValueError, match="overlap_decode needs admission='reserve'"):
        _engine(ContextHashModel(), overlap=True, admission="optimistic")


def _stop_at_fifth_token(prompt: list[int]) -> SamplingParams:
    reference = reference_output(prompt, SamplingParams(max_new_tokens=20), max_seq_len=256)
    assert reference[4] not in reference[:4]
    return SamplingParams(max_new_tokens=20, stop_token_ids=(reference[4],))


def test_stats_count_only_the_tokens_reported() -> None:
    prompts = [[3, 1, 4], [5, 5]]
    params = [_stop_at_fifth_token(prompts[0]), SamplingParams(max_new_tokens=12)]
    stats = {}
    for overlap in (False, True):
        engine = _engine(ContextHashModel(), overlap=overlap)
        outputs = engine.generate(prompts, params)
        assert engine.stats.decode_tokens == sum(len(o.output_ids) - 1 for o in outputs)
        stats[overlap] = (engine.stats.steps, engine.stats.decode_tokens)
        _assert_pool_empty(engine)
    assert stats[True] == stats[False]


def test_a_step_launched_past_the_last_stop_token_is_dropped_at_once() -> None:
    """When the last request stops, the step launched ahead for it is waited for and dropped
    before `generate` returns, so nothing is left to raise at a later synchronisation."""
    prompt = [3, 1, 4]
    engine = _engine(ContextHashModel(), overlap=True)
    [output] = engine.generate([prompt], [_stop_at_fifth_token(prompt)])
    assert len(output.output_ids) == 5 and not engine.has_unfinished()
    assert engine._loop._in_flight is None
    _assert_pool_empty(engine)


def _planning_fails(monkeypatch: pytest.MonkeyPatch, step: int, request_id: int) -> None:
    """`Scheduler._plan_tokens` raises for `request_id` when planning step `step`."""
    original = Scheduler._plan_tokens

    def plan_tokens(self, request, token_ids, samples, plan, planned_step):
        if planned_step == step and request.request_id == request_id:
            raise ValueError("planning exploded")
        return original(self, request, token_ids, samples, plan, planned_step)

    monkeypatch.setattr(Scheduler, "_plan_tokens", plan_tokens)


def test_a_failure_while_planning_ahead_keeps_the_tokens_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _planning_fails(monkeypatch, step=4, request_id=0)
    params = SamplingParams(max_new_tokens=10)
    outputs = {}
    for overlap in (False, True):
        engine = _engine(ContextHashModel(), overlap=overlap)
        [output] = engine.generate([[1, 2, 3]], params)
        assert output.finish_reason is FinishReason.FAILED
        outputs[overlap] = list(output.output_ids)
        _assert_pool_empty(engine)
    assert (
        outputs[True] == outputs[False] == reference_output([1, 2, 3], params, max_seq_len=256)[:4]
    )


def test_a_step_planned_ahead_admits_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planning request 0's row of step 3 (planned ahead) fails and frees a slot; the step
    # before it fails at evaluation, so the step ahead is dropped. Had the step ahead admitted
    # request 2, its prefill would have been dropped with it while its slots stayed appended.
    _planning_fails(monkeypatch, step=3, request_id=0)
    fired: list[bool] = []

    def second_decode(md) -> bool:
        if fired or md.query_len != 1 or sorted(md.context_lens_host)[-2:] != [4, 5]:
            return False
        fired.append(True)
        return True

    engine = _engine(FailingModel(second_decode, lazy=True), overlap=True, max_batch_size=2)
    params = SamplingParams(max_new_tokens=10)
    outputs = engine.generate([[1, 2, 3], [4, 5], [7, 7, 7]], params)
    assert fired
    assert [o.finish_reason for o in outputs[:2]] == [FinishReason.FAILED] * 2
    assert list(outputs[2].output_ids) == reference_output([7, 7, 7], params, max_seq_len=256)
    _assert_pool_empty(engine)


class _InterruptedOnce(ContextHashModel):
    """Raises `KeyboardInterrupt` while building the first decode call at context length 6
    (a Ctrl-C while the host builds the step ahead)."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def step(self, tokens, metadata, kv):
        if not self.fired and metadata.query_len == 1 and 6 in metadata.context_lens_host:
            self.fired = True
            raise KeyboardInterrupt
        return super().step(tokens, metadata, kv)


def test_an_interrupt_while_launching_ahead_fails_those_requests_and_nothing_else() -> None:
    model = _InterruptedOnce()
    engine = _engine(model, overlap=True)
    interrupted = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8))
    with pytest.raises(KeyboardInterrupt):
        while engine.has_unfinished():
            engine.step()
    assert model.fired
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (interrupted, FinishReason.FAILED)
    assert isinstance(event.error, KeyboardInterrupt) and not engine.has_unfinished()
    _assert_pool_empty(engine)
    [output] = engine.generate([[9, 4]], SamplingParams(max_new_tokens=6))
    assert list(output.output_ids) == reference_output(
        [9, 4], SamplingParams(max_new_tokens=6), max_seq_len=256
    )


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_give_every_request_the_same_tokens(seed: int) -> None:
    rng = random.Random(seed)
    prompts = random_prompts(rng, 10, max_len=12)
    params = [
        SamplingParams(
            max_new_tokens=rng.randint(1, 15),
            temperature=rng.choice([0.0, 0.8]),
            seed=rng.randrange(1000),
            stop_token_ids=tuple(rng.sample(range(VOCAB_SIZE), 3)),
        )
        for _ in prompts
    ]
    batch = rng.randint(1, 4)
    results = {}
    for overlap in (False, True):
        engine = _engine(
            ContextHashModel(max_seq_len=20), overlap=overlap, max_batch_size=batch, num_pages=24
        )
        outputs = engine.generate(prompts, params)
        results[overlap] = [(o.output_ids, o.finish_reason) for o in outputs]
        assert all(PENDING_TOKEN not in o.output_ids for o in outputs)
        _assert_pool_empty(engine)
    assert results[True] == results[False]


def test_an_interrupt_ahead_of_a_failed_step_leaves_no_failed_storage_behind(monkeypatch) -> None:
    """Step n fails lazily (at context 6) and the host is interrupted while it builds step
    n + 1, before step n is collected: step n's storage must not stay the engine's."""
    # Submission does nothing here, so the failure surfaces when step n is collected. With
    # real submission MLX may raise it already there, when its worker thread runs the failing
    # CPU task before `async_eval` returns (a race), and then nothing is launched ahead.
    monkeypatch.setattr(mx, "async_eval", lambda *arrays: None)
    state = {"failed": False, "interrupted": False}

    class InterruptedAfterFailure(FailingModel):
        def step(self, tokens, metadata, kv):
            if state["failed"] and not state["interrupted"] and metadata.query_len == 1:
                state["interrupted"] = True
                raise KeyboardInterrupt
            return super().step(tokens, metadata, kv)

    def fail_when(md) -> bool:
        if state["failed"] or md.query_len != 1 or 6 not in md.context_lens_host:
            return False
        state["failed"] = True
        return True

    engine = _engine(InterruptedAfterFailure(fail_when, lazy=True), overlap=True)
    engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8))
    with pytest.raises(KeyboardInterrupt):
        while engine.has_unfinished():
            engine.step()
    assert state["failed"] and state["interrupted"]
    while engine.has_unfinished():
        engine.step()
    _assert_pool_empty(engine)
    params = SamplingParams(max_new_tokens=5)
    [output] = engine.generate([[7, 7]], params)
    assert output.finish_reason is FinishReason.LENGTH
    assert list(output.output_ids) == reference_output([7, 7], params, max_seq_len=256)
