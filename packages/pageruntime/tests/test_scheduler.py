"""The scheduler alone (host logic only): admission policies, chunking, preemption, release."""

from __future__ import annotations

from pagepool import PagePool
from pageruntime import AdmissionPolicy, FinishReason, SamplingParams
from pageruntime.request import Request, RequestState
from pageruntime.scheduler import Scheduler, StepPlan


def _scheduler(admission: str, *, num_pages: int = 10, max_batch_size: int = 4, budget: int = 8):
    pool = PagePool(page_size=4, num_pages=num_pages)
    scheduler = Scheduler(
        pool,
        max_batch_size=max_batch_size,
        prefill_step=budget,
        admission=AdmissionPolicy(admission),
        max_seq_len=1000,
    )
    return pool, scheduler


def _add(scheduler: Scheduler, request_id: int, num_prompt: int, max_new: int) -> Request:
    request = Request(
        request_id,
        tuple(range(num_prompt)),
        SamplingParams(max_new_tokens=max_new),
        max_seq_len=1000,
    )
    scheduler.add(request)
    return request


def _commit(plan: StepPlan) -> None:
    """What the engine does after the model: every sampling row gets token 0."""
    for work in plan.works:
        if work.samples:
            work.request.add_output(0)
            work.request.state = RequestState.DECODE


def test_reserve_admits_while_reservations_fit_in_order() -> None:
    pool, scheduler = _scheduler("reserve", num_pages=10)
    first = _add(scheduler, 0, 8, 13)  # 20 K/V tokens: 5 pages
    second = _add(scheduler, 1, 8, 17)  # 24: 6 pages, does not fit beside the first
    third = _add(scheduler, 2, 1, 1)  # 1 page; waits behind the second (no overtaking)
    scheduler.schedule(step=0)
    assert [first.state, second.state, third.state] == [
        RequestState.PREFILL,
        RequestState.WAITING,
        RequestState.WAITING,
    ]


def test_optimistic_admits_when_the_prompt_fits() -> None:
    pool, scheduler = _scheduler("optimistic", num_pages=10, budget=100)
    requests = [_add(scheduler, n, 8, 100) for n in range(3)]  # 2 prompt pages each
    plan = scheduler.schedule(step=0)
    assert all(r.state is RequestState.PREFILL for r in requests)
    assert [len(work.token_ids) for work in plan.prefill] == [8, 8, 8]
    assert pool.num_live == 6


def test_optimistic_counts_pages_promised_to_unfinished_prefills() -> None:
    pool, scheduler = _scheduler("optimistic", num_pages=10, budget=4)
    long = _add(scheduler, 0, 32, 1)  # 8 pages, prefilled 4 tokens per step
    short = _add(scheduler, 1, 12, 1)  # 3 pages: 10 - 8 promised is too few
    scheduler.schedule(step=0)
    assert pool.num_live == 1
    assert (long.state, short.state) == (RequestState.PREFILL, RequestState.WAITING)


def test_max_batch_size_caps_running_requests() -> None:
    pool, scheduler = _scheduler("reserve", num_pages=100, max_batch_size=2)
    requests = [_add(scheduler, n, 2, 2) for n in range(3)]
    scheduler.schedule(step=0)
    assert [r.state for r in requests].count(RequestState.PREFILL) == 2


def test_prefill_is_chunked_under_the_budget_and_decode_comes_first() -> None:
    pool, scheduler = _scheduler("reserve", num_pages=100, budget=8)
    first = _add(scheduler, 0, 3, 5)
    second = _add(scheduler, 1, 20, 5)
    plans = []
    for step in range(4):
        plans.append(scheduler.schedule(step))
        _commit(plans[-1])
    shapes = [
        ([w.request.request_id for w in p.decode], [len(w.token_ids) for w in p.prefill])
        for p in plans
    ]
    assert shapes == [([], [3, 5]), ([0], [8]), ([0], [7]), ([0, 1], [])]
    assert [w.samples for w in plans[0].prefill] == [True, False]
    assert plans[1].decode[0].token_ids == (0,)  # the last output token is fed back
    assert first.num_computed == 6 and second.num_computed == 21


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    pool, scheduler = _scheduler("optimistic", num_pages=4, budget=100)
    old = _add(scheduler, 0, 7, 100)
    new = _add(scheduler, 1, 8, 100)
    later = _add(scheduler, 2, 1, 1)
    _commit(scheduler.schedule(step=0))  # 2 + 2 pages: the pool is full
    assert later.state is RequestState.WAITING
    plan = scheduler.schedule(step=1)  # the old request needs a page for its 9th token
    assert [w.request for w in plan.decode] == [old]
    assert new.state is RequestState.WAITING and new.num_preemptions == 1
    assert scheduler.num_preemptions == 1 and new.page_list is None
    _commit(plan)
    scheduler.finish(old, FinishReason.LENGTH, step=1)
    assert pool.num_live == 0
    plan = scheduler.schedule(step=2)
    # The preempted request is admitted before the one queued behind it, with its output.
    assert [w.request for w in plan.prefill] == [new, later]
    assert new.prefill_len == 9 and plan.prefill[0].token_ids == (*range(8), 0)


def test_finish_releases_pages_and_dequeues() -> None:
    pool, scheduler = _scheduler("reserve", num_pages=10)
    running = _add(scheduler, 0, 9, 2)
    waiting = _add(scheduler, 1, 30, 10)
    scheduler.schedule(step=0)
    assert pool.num_live == 2 and waiting.state is RequestState.WAITING  # a chunk of 8
    scheduler.finish(waiting, FinishReason.ABORTED, step=0)
    scheduler.finish(running, FinishReason.FAILED, step=0, error=RuntimeError("x"))
    assert pool.num_live == 0
    assert scheduler.schedule(step=1).works == []  # nothing left to run
    assert running.finished and str(running.error) == "x" and running.page_list is None
