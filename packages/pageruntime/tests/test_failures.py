"""A model or sampler that raises: the affected requests fail, their pages return, others go on."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

import pageruntime.runner
import pageruntime.scheduler
from pagepool import PageList
from pageruntime import FinishReason, RequestFailed, SamplingParams
from pageruntime.testing import FailingModel, FailingSampler, reference_output

PARAMS = SamplingParams(max_new_tokens=6)


def _once(predicate):
    """A `fail_when` that is true for the first call matching `predicate` only."""
    fired = []

    def fail_when(*args) -> bool:
        if fired or not predicate(*args):
            return False
        fired.append(True)
        return True

    return fail_when


def _assert_pool_empty(engine) -> None:
    pool = engine.pool
    assert pool.num_live == 0 and pool.num_free == pool.capacity
    assert all(pool.refcount(page_id) == 0 for page_id in range(pool.capacity))


class PlanningExploded(RuntimeError):
    """The failure injected while a step is being planned."""


def _raising_on_call(n: int, function, calls: list):
    """`function`, except that its `n`-th call (counted in `calls`) raises `PlanningExploded`."""

    def wrapper(*args, **kwargs):
        calls.append(args)
        if len(calls) == n:
            raise PlanningExploded(f"call {n} exploded")
        return function(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    ("target", "n", "victim"),
    [("append", 1, "a"), ("append", 2, "b"), ("append", 3, "c"), ("append", 4, "d"),
     ("new-page-list", 1, "c"), ("new-page-list", 2, "d")],
    ids=["decode-row-1", "decode-row-2", "first-chunk", "second-chunk", "admission-1",
         "admission-2"],
)  # fmt: skip
def test_a_failure_while_planning_fails_that_request_only(
    make_engine, monkeypatch: pytest.MonkeyPatch, target: str, n: int, victim: str
) -> None:
    engine = make_engine(prefill_step=12)
    prompts = {"a": [1, 2, 3], "b": [4, 5, 6, 7, 8], "c": list(range(10, 20)), "d": [9, 9]}
    ids = {name: engine.add_request(prompts[name], PARAMS) for name in "ab"}
    aborted = engine.add_request([7] * 4, PARAMS)
    events = engine.step()  # a and b prefill; the third one too, and is aborted below
    ids |= {name: engine.add_request(prompts[name], PARAMS) for name in "cd"}
    assert engine.abort(aborted)
    # The planned step: decode rows a, b (appends 1, 2), admission of c, d (page lists 1, 2),
    # prefill of c, d (appends 3, 4). The n-th of them raises.
    calls: list = []
    if target == "append":
        monkeypatch.setattr(PageList, "append", _raising_on_call(n, PageList.append, calls))
    else:
        factory = _raising_on_call(n, PageList, calls)
        monkeypatch.setattr(pageruntime.scheduler, "PageList", factory)
    planned = engine.step()
    monkeypatch.undo()
    assert (planned[0].request_id, planned[0].finish_reason) == (aborted, FinishReason.ABORTED)
    failed = [e for e in planned if e.finish_reason is FinishReason.FAILED]
    assert [e.request_id for e in failed] == [ids[victim]]
    assert isinstance(failed[0].error, PlanningExploded) and failed[0].token is None
    pool = engine.pool
    holders = sum(pool.refcount(page_id) for page_id in range(pool.capacity))
    assert holders == pool.num_live == pool.capacity - pool.num_free
    # Everything else is served as if nothing happened: its pages hold exactly its tokens.
    events += planned
    while engine.has_unfinished():
        events += engine.step()
    for name, request_id in ids.items():
        tokens = [e.token for e in events if e.request_id == request_id and e.token is not None]
        if name != victim:
            assert tokens == reference_output(prompts[name], PARAMS, max_seq_len=256)
    _assert_pool_empty(engine)
    assert list(engine.generate([[4, 2]], PARAMS)[0].output_ids) == reference_output(
        [4, 2], PARAMS, max_seq_len=256
    )


def test_aborts_are_still_reported_after_a_step_that_raised(
    make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    request_id = engine.add_request([1, 2, 3], PARAMS)
    engine.step()
    assert engine.abort(request_id)
    schedule = pageruntime.scheduler.Scheduler.schedule
    monkeypatch.setattr(
        pageruntime.scheduler.Scheduler, "schedule", _raising_on_call(1, schedule, [])
    )
    with pytest.raises(PlanningExploded):
        engine.step()
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (request_id, FinishReason.ABORTED)
    assert not engine.has_unfinished()
    _assert_pool_empty(engine)


def test_a_failing_decode_call_fails_its_rows_only(make_engine) -> None:
    # The decode call that first reaches context length 8 raises (both 6-token prompts).
    model = FailingModel(_once(lambda md: md.query_len == 1 and 8 in md.context_lens_host))
    engine = make_engine(model, prefill_step=64, num_pages=64)
    first = engine.add_request([1] * 6, PARAMS)
    second = engine.add_request([2] * 6, PARAMS)
    engine.step()
    long_prompt = list(range(40)) * 4
    third = engine.add_request(long_prompt, PARAMS)  # prefilling while the others decode
    events = []
    with capture_logs() as logs:
        while engine.has_unfinished():
            events += engine.step()
    failed = [e for e in events if e.finish_reason is FinishReason.FAILED]
    assert [e.request_id for e in failed] == [first, second]
    assert all(isinstance(e.error, RuntimeError) and e.token is None for e in failed)
    assert [e.token for e in events if e.request_id == third] == reference_output(
        long_prompt, PARAMS, max_seq_len=256
    )
    failures = [e for e in logs if e["event"] == "request_failed"]
    assert [e["request_id"] for e in failures] == [first, second]
    assert all(e["log_level"] == "warning" and "model exploded" in e["error"] for e in failures)
    assert all(e["num_pages"] == 2 for e in failures)  # 7 tokens: their pages were released
    _assert_pool_empty(engine)
    # The engine keeps serving.
    assert list(engine.generate([[4, 2]], PARAMS)[0].output_ids) == reference_output(
        [4, 2], PARAMS, max_seq_len=256
    )


def test_a_failing_prefill_chunk_fails_that_request_only(make_engine) -> None:
    model = FailingModel(lambda md: md.query_len == 5)
    engine = make_engine(model, prefill_step=64)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 9]]
    outputs = engine.generate(prompts, PARAMS)
    assert [o.finish_reason for o in outputs] == [
        FinishReason.LENGTH,
        FinishReason.FAILED,
        FinishReason.LENGTH,
    ]
    assert outputs[1].output_ids == () and str(outputs[1].error) == "model exploded"
    for prompt, output in zip(prompts[::2], outputs[::2], strict=True):
        assert list(output.output_ids) == reference_output(prompt, PARAMS, max_seq_len=256)
    assert engine.stats.requests_failed == 1 and engine.stats.requests_finished == 2
    _assert_pool_empty(engine)


def test_a_failing_sampler_fails_the_rows_it_was_sampling(make_engine) -> None:
    sampler = FailingSampler(lambda params, indices: any(p.seed == 13 for p in params))
    engine = make_engine(sampler=sampler, prefill_step=64)
    doomed = SamplingParams(max_new_tokens=6, seed=13)
    outputs = engine.generate([[1, 2], [3, 4], [5, 6]], [PARAMS, doomed, PARAMS])
    assert sampler.num_failures == 1
    assert outputs[1].finish_reason is FinishReason.FAILED
    assert isinstance(outputs[1].error, ValueError)
    assert list(outputs[0].output_ids) == reference_output([1, 2], PARAMS, max_seq_len=256)
    assert list(outputs[2].output_ids) == reference_output([5, 6], PARAMS, max_seq_len=256)
    _assert_pool_empty(engine)


def test_a_failure_at_evaluation_fails_the_step_and_restores_storage(make_engine) -> None:
    # The error surfaces only when the step evaluates, so no call can be blamed: every request
    # that ran in that step fails, and storage is rolled back to before the step.
    model = FailingModel(_once(lambda md: md.query_len == 5), lazy=True)
    engine = make_engine(model, prefill_step=5)
    decoding = engine.add_request([1, 2, 3], PARAMS)
    engine.step()
    prefilling = engine.add_request([4, 5, 6, 7, 8], PARAMS)
    starved = engine.add_request([7, 7], PARAMS)  # admitted, but the budget is spent
    storage_before = model.storage.keys + model.storage.values
    events = engine.step()
    assert model.num_failures == 1
    storage_after = model.storage.keys + model.storage.values
    assert all(a is b for a, b in zip(storage_before, storage_after, strict=True))
    failed = [e for e in events if e.finish_reason is FinishReason.FAILED]
    assert {e.request_id for e in failed} == {decoding, prefilling}
    assert all("LU factorization" in str(e.error) for e in failed)
    tokens = []
    while engine.has_unfinished():
        tokens += [e.token for e in engine.step() if e.request_id == starved]
    # The request that did not run in the failed step is intact, and so is new work.
    assert tokens == reference_output([7, 7], PARAMS, max_seq_len=256)
    assert list(engine.generate([[8, 1]], PARAMS)[0].output_ids) == reference_output(
        [8, 1], PARAMS, max_seq_len=256
    )
    _assert_pool_empty(engine)


def test_a_failed_stream_raises_after_its_tokens(make_engine) -> None:
    model = FailingModel(lambda md: md.query_len == 1 and 6 in md.context_lens_host)
    engine = make_engine(model, prefill_step=64)
    received = []
    with pytest.raises(RequestFailed, match="request 0 failed") as caught:
        for token in engine.stream([1, 2, 3, 4], PARAMS):
            received.append(token)
    assert received == reference_output([1, 2, 3, 4], PARAMS, max_seq_len=256)[:2]
    assert isinstance(caught.value.__cause__, RuntimeError)
    _assert_pool_empty(engine)


@pytest.mark.parametrize(
    ("reshape", "shape"),
    [(lambda logits: logits[:, None], "(1, 1, 61)"), (lambda logits: logits[:, :-1], "(1, 60)")],
    ids=["rank-3", "narrower-than-vocab"],
)
def test_a_model_returning_bad_logits_fails_its_requests(make_engine, reshape, shape) -> None:
    class WrongShape(FailingModel):
        def step(self, tokens, metadata, kv):
            return reshape(super().step(tokens, metadata, kv))

    engine = make_engine(WrongShape(lambda md: False))
    [output] = engine.generate([[1, 2]], PARAMS)
    assert output.finish_reason is FinishReason.FAILED
    assert f"logits of shape {shape}, expected [1, 61] ([B, vocab_size])" in str(output.error)
    _assert_pool_empty(engine)


class _RecordingStore:
    """A `KVStore` that is no `KVStorage`: it wraps one and records the engine's calls."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[str] = []

    # The KVStore members are spelled out: from Python 3.12 on, isinstance() against a
    # runtime-checkable protocol looks members up statically and misses __getattr__.
    @property
    def pool(self):
        return self.inner.pool

    def copy_pages(self, copies) -> None:
        self.inner.copy_pages(copies)

    def __getattr__(self, name: str):  # what the model uses: keys, values, update_layer, ...
        return getattr(self.inner, name)

    def step_arrays(self):
        self.calls.append("step_arrays")
        return self.inner.step_arrays()

    def snapshot(self):
        self.calls.append("snapshot")
        return self.inner.snapshot()

    def restore(self, snapshot) -> None:
        self.calls.append("restore")
        self.inner.restore(snapshot)


def test_any_kv_store_is_snapshotted_and_restored_around_a_failed_step(make_sync_engine) -> None:
    class WrappedStorage(FailingModel):
        def make_kv_storage(self, pool):
            self.store = _RecordingStore(super().make_kv_storage(pool))
            return self.store

    model = WrappedStorage(_once(lambda md: md.query_len == 1), lazy=True)
    engine = make_sync_engine(model)
    request = engine.add_request([1, 2, 3], PARAMS)
    engine.step()  # prefill: evaluated through step_arrays
    assert model.store.calls == ["snapshot", "step_arrays"]
    events = engine.step()  # the first decode fails when evaluated
    assert model.store.calls[2:] == ["snapshot", "step_arrays", "restore"]
    assert [e.finish_reason for e in events if e.request_id == request] == [FinishReason.FAILED]
    assert list(engine.generate([[8, 1]], PARAMS)[0].output_ids) == reference_output(
        [8, 1], PARAMS, max_seq_len=256
    )
    _assert_pool_empty(engine)


def _interrupting_collect(monkeypatch: pytest.MonkeyPatch, when) -> list[bool]:
    """`StepRunner.collect` raises `KeyboardInterrupt` (a Ctrl-C while the host waits for the
    device) the first time `when(launched)` holds; returns a flag list that says it fired."""
    original = pageruntime.runner.StepRunner.collect
    fired: list[bool] = []

    def collect(self, launched):
        if not fired and when(launched):
            fired.append(True)
            raise KeyboardInterrupt
        return original(self, launched)

    monkeypatch.setattr(pageruntime.runner.StepRunner, "collect", collect)
    return fired


def test_an_interrupt_while_waiting_fails_that_step_and_the_engine_goes_on(
    make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fired = _interrupting_collect(monkeypatch, lambda launched: launched.step == 4)
    engine = make_engine()
    interrupted = engine.add_request([1, 2, 3], PARAMS)
    tokens = []
    with pytest.raises(KeyboardInterrupt):
        while engine.has_unfinished():
            tokens += [e.token for e in engine.step()]
    assert fired
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (interrupted, FinishReason.FAILED)
    assert isinstance(event.error, KeyboardInterrupt) and not engine.has_unfinished()
    assert tokens == reference_output([1, 2, 3], PARAMS, max_seq_len=256)[: len(tokens)]
    _assert_pool_empty(engine)
    [output] = engine.generate([[9, 4]], PARAMS)
    assert list(output.output_ids) == reference_output([9, 4], PARAMS, max_seq_len=256)


def test_an_abort_is_still_reported_after_an_interrupted_step(
    make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    armed: list[bool] = []
    _interrupting_collect(monkeypatch, lambda launched: bool(armed))
    engine = make_engine()
    kept = engine.add_request([1, 2, 3], PARAMS)
    aborted = engine.add_request([4, 5], PARAMS)
    for _ in range(3):
        engine.step()
    assert engine.abort(aborted)
    armed.append(True)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    ends = {e.request_id: e.finish_reason for e in engine.step() if e.finished}
    assert ends == {aborted: FinishReason.ABORTED, kept: FinishReason.FAILED}
    assert not engine.has_unfinished()
    _assert_pool_empty(engine)
