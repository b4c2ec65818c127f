"""The step runner alone: copy-on-write before the call, padding rows, one evaluation."""

from __future__ import annotations

import dataclasses

from pagepool import PageList, PagePool
from pageruntime import SamplingParams, sample_tokens
from pageruntime.request import PENDING_TOKEN, Request, RequestState
from pageruntime.runner import StepOutcome, StepRunner
from pageruntime.scheduler import ScheduledWork, StepPlan
from pageruntime.testing import ContextHashModel, context_hash

PROMPT = (5, 8, 13, 21, 34, 55)


def _setup() -> tuple[PagePool, StepRunner, ContextHashModel]:
    pool = PagePool(page_size=4, num_pages=8)
    model = ContextHashModel()
    runner = StepRunner(
        model, model.make_kv_storage(pool), sample_tokens, max_batch_size=4, max_row_pages=8
    )
    return pool, runner, model


def _run(runner: StepRunner, plan: StepPlan, step: int) -> StepOutcome:
    return runner.collect(runner.launch(plan, step))


def _request(request_id: int, page_list: PageList) -> Request:
    request = Request(request_id, PROMPT, SamplingParams(), max_seq_len=256)
    request.page_list = page_list
    return request


def _append(request: Request, token_ids: tuple[int, ...], samples: bool = True) -> ScheduledWork:
    appended = request.page_list.append(len(token_ids))
    return ScheduledWork(
        request=request, token_ids=token_ids, copies=appended.copies, samples=samples
    )


def _forked_decode_plan(pool: PagePool, runner: StepRunner) -> tuple[StepPlan, Request, Request]:
    """A prefilled request and a fork of it sharing its half-full tail page, one token each."""
    parent = _request(0, PageList(pool))
    prefill = StepPlan(prefill=[_append(parent, PROMPT)])
    assert _run(runner, prefill, step=0).failures == []
    child = _request(1, parent.page_list.fork())
    parent.output_ids, child.output_ids = [1], [2]
    child_work = _append(child, (2,))  # the shared tail page is copied for the child
    assert len(child_work.copies) == 1
    return StepPlan(decode=[_append(parent, (1,)), child_work]), parent, child


def test_copy_on_write_copies_are_made_before_the_call_writes() -> None:
    pool, runner, model = _setup()
    plan, parent, child = _forked_decode_plan(pool, runner)
    outcome = _run(runner, plan, step=1)
    assert outcome.failures == []
    assert outcome.tokens == [
        (parent, context_hash(PROMPT + (1,))),
        (child, context_hash(PROMPT + (2,))),
    ]
    assert model.calls[-1] == (2, 1, 2)  # one decode call, two rows, two pages wide


def test_a_lost_copy_changes_the_output() -> None:
    # The check above can fail: without the copy, the child's tail misses two prompt tokens.
    pool, runner, _ = _setup()
    plan, parent, child = _forked_decode_plan(pool, runner)
    plan.decode = [dataclasses.replace(work, copies=()) for work in plan.decode]
    tokens = dict(_run(runner, plan, step=1).tokens)
    assert tokens[parent] == context_hash(PROMPT + (1,))
    assert tokens[child] != context_hash(PROMPT + (2,))


def test_decode_rows_are_padded_to_the_batch_bucket() -> None:
    pool, runner, model = _setup()
    requests = [_request(n, PageList(pool)) for n in range(3)]
    for request in requests:
        _run(runner, StepPlan(prefill=[_append(request, PROMPT[: 2 + request.request_id])]), 0)
        request.output_ids = [7]
    plan = StepPlan(decode=[_append(request, (7,)) for request in requests])
    outcome = _run(runner, plan, step=1)
    assert model.calls[-1] == (4, 1, 2)
    assert [token for _, token in outcome.tokens] == [
        context_hash(PROMPT[: 2 + n] + (7,)) for n in range(3)
    ]


def test_a_chunk_that_does_not_sample_returns_no_token() -> None:
    pool, runner, _ = _setup()
    request = _request(0, PageList(pool))
    outcome = _run(runner, StepPlan(prefill=[_append(request, PROMPT[:4], samples=False)]), 0)
    assert outcome.tokens == [] and outcome.failures == []
    outcome = _run(runner, StepPlan(prefill=[_append(request, PROMPT[4:])]), 1)
    assert outcome.tokens == [(request, context_hash(PROMPT))]


def test_a_pending_token_is_read_from_the_step_that_samples_it() -> None:
    pool, runner, _ = _setup()
    request = _request(0, PageList(pool))
    prefill = runner.launch(StepPlan(prefill=[_append(request, PROMPT)]), step=0)
    request.state = RequestState.DECODE
    request.add_pending_output()
    ahead = runner.launch(StepPlan(decode=[_append(request, (PENDING_TOKEN,))]), 1, prefill)
    [(_, first)] = runner.collect(prefill).tokens
    [(_, second)] = runner.collect(ahead).tokens
    assert first == context_hash(PROMPT)
    assert second == context_hash(PROMPT + (first,))


def test_a_pending_token_without_the_step_that_samples_it_fails_its_call() -> None:
    pool, runner, model = _setup()
    request = _request(0, PageList(pool))
    launched = runner.launch(StepPlan(decode=[_append(request, (PENDING_TOKEN,))]), step=0)
    [(failed, error)] = launched.failures
    assert failed == [request] and "pending token" in str(error)
    assert model.calls == []


def test_fail_restores_the_storage_and_fails_every_request() -> None:
    pool, runner, _ = _setup()
    requests = [_request(n, PageList(pool)) for n in range(2)]
    before = runner._kv.snapshot()
    launched = runner.launch(
        StepPlan(prefill=[_append(r, PROMPT[: 3 + r.request_id]) for r in requests]), step=0
    )
    assert runner._kv.keys[0] is not before[0][0]
    outcome = runner.fail(launched, RuntimeError("device lost"))
    assert outcome.evaluation_failed and outcome.tokens == []
    assert [(r, str(e)) for r, e in outcome.failures] == [(requests, "device lost")]
    assert all(a is b for a, b in zip(runner._kv.keys, before[0], strict=True))
