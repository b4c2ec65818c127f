"""The engine's public API: generate, stream, add_request/step, abort, and its input checks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagepool import KVStorage, PagePool
from pageruntime import (
    AdmissionPolicy,
    Engine,
    FinishReason,
    RequestRejected,
    SamplingParams,
    TokenEvent,
)
from pageruntime.testing import ContextHashModel, random_prompts, reference_output


def test_a_request_alone_matches_the_python_oracle(make_engine) -> None:
    engine = make_engine()
    prompt, params = list(range(1, 20)), SamplingParams(max_new_tokens=12)
    [output] = engine.generate([prompt], params)
    assert output.output_ids == tuple(reference_output(prompt, params, max_seq_len=256))
    assert output.prompt_ids == tuple(prompt)
    assert output.finish_reason is FinishReason.LENGTH and output.error is None
    assert engine.pool.num_live == 0 and not engine.has_unfinished()


def test_batched_greedy_requests_match_the_oracle_in_submission_order(make_engine) -> None:
    rng = random.Random(0)
    prompts = random_prompts(rng, 11, max_len=30)
    params = [SamplingParams(max_new_tokens=rng.randint(1, 15)) for _ in prompts]
    outputs = make_engine(max_batch_size=4).generate(prompts, params)
    assert [output.request_id for output in outputs] == list(range(11))
    for prompt, p, output in zip(prompts, params, outputs, strict=True):
        assert list(output.output_ids) == reference_output(prompt, p, max_seq_len=256)


def test_sampled_requests_give_the_same_tokens_batched_as_alone(make_engine) -> None:
    rng = random.Random(1)
    prompts = random_prompts(rng, 6, max_len=20)
    params = [
        SamplingParams(temperature=1.0, top_k=30, top_p=0.95, seed=seed, max_new_tokens=12)
        for seed in range(6)
    ]
    together = make_engine(max_batch_size=4).generate(prompts, params)
    for prompt, p, output in zip(prompts, params, together, strict=True):
        [alone] = make_engine().generate([prompt], p)
        assert alone.output_ids == output.output_ids
    greedy = [
        reference_output(prompt, SamplingParams(max_new_tokens=12), max_seq_len=256)
        for prompt in prompts
    ]
    assert sum(list(o.output_ids) != g for o, g in zip(together, greedy, strict=True)) >= 3


def test_a_stop_token_ends_the_request_and_is_kept(make_engine) -> None:
    prompt = [5, 9, 2, 7]
    free_run = reference_output(prompt, SamplingParams(max_new_tokens=20), max_seq_len=256)
    stop = free_run[4]
    [output] = make_engine().generate(
        [prompt], SamplingParams(max_new_tokens=20, stop_token_ids=[stop])
    )
    assert output.finish_reason is FinishReason.STOP
    assert list(output.output_ids) == free_run[: free_run.index(stop) + 1]


def test_the_model_limit_ends_the_request_at_max_seq_len(make_engine) -> None:
    engine = make_engine(ContextHashModel(max_seq_len=20))
    [output] = engine.generate([list(range(15))], SamplingParams(max_new_tokens=100))
    assert output.finish_reason is FinishReason.MAX_SEQ_LEN
    assert len(output.output_ids) == 5
    assert engine.pool.num_live == 0


@pytest.mark.parametrize(
    ("prompt", "params", "admission", "match"),
    [
        ([], None, "reserve", "prompt_ids is empty"),
        ([1, -1], None, "reserve", r"prompt_ids\[1\]=-1 is not a token id"),
        ([1, True], None, "reserve", r"prompt_ids\[1\]=True is not a token id"),
        ([2.0], None, "reserve", r"prompt_ids\[0\]=2.0 is not a token id"),
        ([3, 4, 61], None, "reserve", r"prompt_ids\[2\]=61 .* \[0, 61\) \(vocab_size=61\)"),
        ([10**6], None, "reserve", r"prompt_ids\[0\]=1000000 is not a token id"),
        ([5, 2**31], None, "reserve", r"prompt_ids\[1\]=2147483648 is not"),
        ([np.int64(70)], None, "reserve", r"prompt_ids\[0\]=np.int64\(70\) is not"),
        ([1], SamplingParams(stop_token_ids=[3, 61]), "reserve", r"stop_token_ids\[1\]=61"),
        ("abc", None, "reserve", "sequence of ints"),
        (list(range(40)), None, "reserve", "max_seq_len is 40"),
        (list(range(41)), None, "reserve", "max_seq_len is 40"),
        ([1] * 30, SamplingParams(max_new_tokens=5), "reserve", "optimistic"),
        ([1] * 33, SamplingParams(max_new_tokens=1), "optimistic", "its prompt"),
    ],
    ids=[
        "empty-prompt",
        "negative-token",
        "bool-token",
        "float-token",
        "token-at-vocab-size",
        "token-far-past-vocab",
        "token-past-int32",
        "numpy-token-past-vocab",
        "stop-token-past-vocab",
        "string-prompt",
        "prompt-at-max-seq-len",
        "prompt-over-max-seq-len",
        "reservation-over-capacity",
        "prompt-over-capacity",
    ],
)
def test_bad_requests_are_rejected_before_anything_is_allocated(
    make_engine, prompt, params, admission: str, match: str
) -> None:
    model = ContextHashModel(max_seq_len=40)
    engine = make_engine(model, num_pages=8, admission=admission)
    with pytest.raises(RequestRejected, match=match):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()
    assert engine.step() == []
    assert engine.pool.metrics().num_allocations == 0 and model.calls == []
    with pytest.raises(RequestRejected, match=match):
        engine.stream(prompt, params)
    assert not engine.has_unfinished()


def test_a_prompt_may_be_any_iterable_of_ints(make_engine) -> None:
    engine = make_engine()
    [from_range, from_list, from_numpy] = engine.generate(
        [range(3, 9), [3, 4, 5, 6, 7, 8], np.arange(3, 9)]
    )
    assert from_range.output_ids == from_list.output_ids == from_numpy.output_ids
    assert from_range.prompt_ids == from_numpy.prompt_ids == (3, 4, 5, 6, 7, 8)
    assert all(type(token) is int for token in from_numpy.prompt_ids)


def test_the_whole_vocabulary_is_accepted(make_engine) -> None:
    last = ContextHashModel.vocab_size - 1
    params = SamplingParams(max_new_tokens=3, stop_token_ids=[0, last])
    [output] = make_engine().generate([[0, last, 0]], params)
    assert list(output.output_ids) == reference_output([0, last, 0], params, max_seq_len=256)


def test_params_must_be_sampling_params(make_engine) -> None:
    with pytest.raises(TypeError, match="SamplingParams"):
        make_engine().add_request([1, 2], {"max_new_tokens": 3})


def test_generate_rejects_all_prompts_when_one_is_bad(make_engine) -> None:
    engine = make_engine(ContextHashModel(max_seq_len=40))
    with pytest.raises(RequestRejected):
        engine.generate([[1, 2], list(range(50)), [3]])
    assert not engine.has_unfinished() and engine.stats.steps == 0
    with pytest.raises(ValueError, match="2 prompts but 3"):
        engine.generate([[1], [2]], [SamplingParams()] * 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_pages=0), ValueError, "num_pages must be an int >= 1, got 0"),
        (dict(page_size=0), ValueError, "page_size must be an int >= 1"),
        (dict(max_batch_size=0), ValueError, "max_batch_size must be an int >= 1"),
        (dict(prefill_step=0), ValueError, "prefill_step must be an int >= 1"),
        (dict(num_pages=True), ValueError, "num_pages must be an int >= 1, got True"),
        (dict(page_size=2.0), ValueError, "page_size must be an int >= 1, got 2.0"),
        (dict(admission="lazy"), ValueError, "admission must be 'reserve' or 'optimistic'"),
        (dict(sampler="argmax"), TypeError, "sampler must be callable, got str"),
        (dict(max_seq_len=0), ValueError, "model.max_seq_len must be an int >= 1, got 0"),
        (dict(vocab_size=0), ValueError, "model.vocab_size must be an int >= 1, got 0"),
        (dict(vocab_size=2**31 + 1), ValueError, r"model.vocab_size must be <= 2\*\*31"),
    ],
    ids=["no-pages", "zero-page-size", "zero-batch", "zero-prefill", "bool", "float", "policy",
         "sampler", "max-seq-len", "vocab-size", "vocab-past-int32"],
)  # fmt: skip
def test_engine_validates_every_argument_before_making_storage(
    kwargs: dict, error: type, match: str
) -> None:
    model = ContextHashModel(max_seq_len=kwargs.pop("max_seq_len", 256))
    model.vocab_size = kwargs.pop("vocab_size", model.vocab_size)
    with pytest.raises(error, match=match):
        Engine(model, **{"num_pages": 8, **kwargs})
    assert model.storage is None  # make_kv_storage (which may allocate GBs) never ran


def test_engine_checks_the_model() -> None:
    with pytest.raises(TypeError, match=r"StepModel \(max_seq_len, vocab_size"):
        Engine(object(), num_pages=8)  # type: ignore[arg-type]

    class NoVocabulary:
        max_seq_len = 64
        make_kv_storage = ContextHashModel.make_kv_storage
        step = ContextHashModel.step

    with pytest.raises(TypeError, match="got NoVocabulary"):
        Engine(NoVocabulary(), num_pages=8)  # type: ignore[arg-type]

    class ForeignStorage(ContextHashModel):
        def make_kv_storage(self, pool: PagePool) -> KVStorage:
            return super().make_kv_storage(PagePool(pool.page_size, pool.capacity))

    with pytest.raises(TypeError, match=r"must return a KVStore \(pool, .*\) over that pool"):
        Engine(ForeignStorage(), num_pages=8)

    class NotAStore(ContextHashModel):
        def make_kv_storage(self, pool: PagePool) -> object:
            return pool  # a PagePool, not a store

    with pytest.raises(TypeError, match="must return a KVStore"):
        Engine(NotAStore(), num_pages=8)


def test_admission_accepts_the_policy_by_name(make_engine) -> None:
    engine = make_engine(admission="optimistic")
    assert engine.generate([[1, 2, 3]])[0].finish_reason is FinishReason.LENGTH
    assert AdmissionPolicy("reserve") is AdmissionPolicy.RESERVE


def test_step_reports_every_token_and_the_end(make_engine) -> None:
    engine = make_engine()
    request_id = engine.add_request([4, 4, 4], SamplingParams(max_new_tokens=3))
    events: list[TokenEvent] = []
    while engine.has_unfinished():
        events += engine.step()
    expected = reference_output([4, 4, 4], SamplingParams(max_new_tokens=3), max_seq_len=256)
    assert [event.token for event in events] == expected
    assert [event.finished for event in events] == [False, False, True]
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert {event.request_id for event in events} == {request_id}


def test_abort_frees_pages_at_once_and_reports_at_the_next_step(make_engine) -> None:
    engine = make_engine(max_batch_size=1)
    running = engine.add_request(list(range(10)), SamplingParams(max_new_tokens=50))
    waiting = engine.add_request([1, 2], SamplingParams(max_new_tokens=50))
    for _ in range(4):
        engine.step()
    assert engine.pool.num_live > 0
    assert engine.abort(running) and engine.abort(waiting)
    assert engine.pool.num_live == 0
    assert engine.has_unfinished()  # until step() has reported the aborts
    events = engine.step()
    assert not engine.has_unfinished()
    assert [(e.request_id, e.token, e.finished, e.finish_reason) for e in events] == [
        (running, None, True, FinishReason.ABORTED),
        (waiting, None, True, FinishReason.ABORTED),
    ]
    assert engine.abort(running) is False
    with pytest.raises(KeyError, match="no request with id 7"):
        engine.abort(7)
    assert engine.stats.requests_aborted == 2


def test_abort_takes_numpy_integers(make_engine) -> None:
    engine = make_engine()
    request_id = engine.add_request([1, 2], SamplingParams(max_new_tokens=4))
    assert engine.abort(np.int64(request_id)) is True
    assert engine.step()[0].finish_reason is FinishReason.ABORTED


@pytest.mark.parametrize("request_id", [True, 0.5, "0", None], ids=repr)
def test_abort_takes_an_int_id_only(make_engine, request_id: object) -> None:
    engine = make_engine()
    engine.add_request([1, 2], SamplingParams(max_new_tokens=4))
    engine.add_request([3, 4], SamplingParams(max_new_tokens=4))
    with pytest.raises(TypeError, match=f"request_id must be an int, got {request_id!r}"):
        engine.abort(request_id)
    assert engine.pool.num_live == 0 and engine.has_unfinished()  # nothing admitted or ended
    assert engine.stats.requests_aborted == 0


def test_stream_yields_the_tokens_while_other_requests_run(make_engine) -> None:
    engine = make_engine()
    other = engine.add_request([3, 1, 4], SamplingParams(max_new_tokens=100))
    params = SamplingParams(max_new_tokens=8)
    tokens = list(engine.stream([2, 7, 1, 8], params))
    assert tokens == reference_output([2, 7, 1, 8], params, max_seq_len=256)
    assert engine.has_unfinished()  # the other request keeps its place and progresses
    assert engine.abort(other)


def test_closing_a_stream_early_aborts_its_request(make_engine) -> None:
    engine = make_engine()
    stream = engine.stream([2, 7, 1, 8], SamplingParams(max_new_tokens=30))
    assert next(stream) == reference_output([2, 7, 1, 8], SamplingParams(), max_seq_len=256)[0]
    assert engine.pool.num_live > 0
    stream.close()
    assert engine.pool.num_live == 0
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (stream.request_id, FinishReason.ABORTED)
    assert not engine.has_unfinished()
    assert list(stream) == []


def test_a_stream_closed_before_its_first_token_or_by_with_aborts(make_engine) -> None:
    engine = make_engine()
    unread = engine.stream([1, 2], SamplingParams(max_new_tokens=30))
    unread.close()
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (unread.request_id, FinishReason.ABORTED)
    with engine.stream([3, 4], SamplingParams(max_new_tokens=30)) as stream:
        assert next(stream) == reference_output([3, 4], SamplingParams(), max_seq_len=256)[0]
    [event] = engine.step()
    assert (event.request_id, event.finish_reason) == (stream.request_id, FinishReason.ABORTED)
    assert engine.pool.metrics().num_allocations == 1  # only the second one ever ran
    assert not engine.has_unfinished()


def test_two_streams_interleave(make_engine) -> None:
    engine = make_engine()
    params = SamplingParams(max_new_tokens=6)
    first, second = engine.stream([1, 2, 3], params), engine.stream([9, 8], params)
    pairs = list(zip(first, second, strict=True))
    assert [a for a, _ in pairs] == reference_output([1, 2, 3], params, max_seq_len=256)
    assert [b for _, b in pairs] == reference_output([9, 8], params, max_seq_len=256)
