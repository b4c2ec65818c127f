"""An exception that escapes `Engine.step` (a Ctrl-C at any point of a step) leaves the engine
consistent: the interrupted requests fail, the others go on exactly, pages return, every
request ends once, and later requests are exact.

A `KeyboardInterrupt` is injected at the k-th call of one function inside a step, for every k
until the function is no longer called, with and without overlapped decode steps, one or three
requests, and an abort queued before the interrupted step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import pageruntime.events
from pagepool import PageList
from pageruntime import Engine, FinishReason, SamplingParams
from pageruntime.request import PENDING_TOKEN, Request
from pageruntime.runner import StepRunner
from pageruntime.sampling import sample_tokens
from pageruntime.scheduler import Scheduler
from pageruntime.testing import ContextHashModel, reference_output

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 9]]
LATER = SamplingParams(max_new_tokens=5)

# (owner, method, raise after the call instead of before it)
TARGETS = {
    "collect": (StepRunner, "collect", False),
    "collect-after": (StepRunner, "collect", True),
    "launch": (StepRunner, "launch", False),
    "launch-after": (StepRunner, "launch", True),
    "schedule": (Scheduler, "schedule", False),
    "schedule-after": (Scheduler, "schedule", True),
    "add_pending_output": (Request, "add_pending_output", False),
    "add_output": (Request, "add_output", False),
    "page-append": (PageList, "append", False),
    "log": (pageruntime.events.log, "log", False),
}


def _params() -> list[SamplingParams]:
    """Request 1 stops on its 5th token; the others end by length."""
    reference = reference_output(PROMPTS[1], SamplingParams(max_new_tokens=20), max_seq_len=256)
    return [
        SamplingParams(max_new_tokens=7),
        SamplingParams(max_new_tokens=20, stop_token_ids=(reference[4],)),
        SamplingParams(max_new_tokens=5),
    ]


class _Trigger:
    """Fires once, at the k-th call counted while a step runs."""

    def __init__(self, k: int) -> None:
        self.k, self.calls, self.fired, self.armed = k, 0, False, False

    def hit(self) -> bool:
        if not self.armed or self.fired:
            return False
        self.calls += 1
        self.fired = self.calls == self.k
        return self.fired

    def wrap(self, function: Callable, *, after: bool) -> Callable:
        def wrapper(*args, **kwargs):
            if not after and self.hit():
                raise KeyboardInterrupt
            result = function(*args, **kwargs)
            if after and self.hit():
                raise KeyboardInterrupt
            return result

        return wrapper


def _problems(target: str, k: int, *, overlap: bool, num_requests: int, abort_at: int | None):
    """Serve the prompts with an interrupt at the k-th call of `target`; what went wrong."""
    trigger = _Trigger(k)
    sampler = None
    with pytest.MonkeyPatch.context() as patch:
        if target == "sampler":
            sampler = trigger.wrap(sample_tokens, after=False)
        else:
            owner, name, after = TARGETS[target]
            patch.setattr(owner, name, trigger.wrap(getattr(owner, name), after=after))
        engine = Engine(
            ContextHashModel(),
            num_pages=32,
            page_size=4,
            prefill_step=8,
            overlap_decode=overlap,
            sampler=sampler,
        )
        params = _params()[:num_requests]
        ids = [engine.add_request(p, q) for p, q in zip(PROMPTS, params, strict=False)]
        events = []
        for step in range(60):
            if not engine.has_unfinished():
                break
            if step == abort_at:
                engine.abort(ids[-1])
            trigger.armed = True
            try:
                events += engine.step()
            except KeyboardInterrupt:
                pass
            finally:
                trigger.armed = False
    if not trigger.fired:
        return None
    problems = ["has_unfinished() stuck"] if engine.has_unfinished() else []
    for request_id, prompt, p in zip(ids, PROMPTS, params, strict=False):
        ends = [e for e in events if e.request_id == request_id and e.finished]
        tokens = [e.token for e in events if e.request_id == request_id and e.token is not None]
        reference = reference_output(prompt, p, max_seq_len=256)
        if len(ends) != 1:
            problems.append(f"request {request_id}: {len(ends)} ends")
        elif PENDING_TOKEN in tokens:
            problems.append(f"request {request_id}: a pending token reported")
        elif ends[0].finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            if tokens != reference:
                problems.append(f"request {request_id}: {tokens} != {reference}")
        elif tokens != reference[: len(tokens)]:
            problems.append(f"request {request_id}: {tokens} not a prefix of {reference}")
    if engine.pool.num_live:
        problems.append(f"{engine.pool.num_live} pages still live")
    [later] = engine.generate([[7, 7]], LATER)
    if list(later.output_ids) != reference_output([7, 7], LATER, max_seq_len=256):
        problems.append(f"a later request got {later.output_ids} ({later.error!r})")
    return problems


@pytest.mark.parametrize(
    ("target", "overlap"),
    [
        (target, overlap)
        for target in [*TARGETS, "sampler"]
        for overlap in (False, True)
        if overlap or target != "add_pending_output"  # only overlapped steps add them
    ],
    ids=lambda value: value if isinstance(value, str) else ("overlap" if value else "sync"),
)
def test_an_interrupt_anywhere_in_a_step_leaves_the_engine_consistent(
    target: str, overlap: bool
) -> None:
    failures = []
    for num_requests in (1, 3):
        for abort_at in (None, 3):
            for k in range(1, 60):
                problems = _problems(
                    target, k, overlap=overlap, num_requests=num_requests, abort_at=abort_at
                )
                if problems is None:  # `target` was called fewer than k times
                    assert k > 1, f"{target} is never called in a step"
                    break
                failures += [(num_requests, abort_at, k, problem) for problem in problems]
    assert failures == []
