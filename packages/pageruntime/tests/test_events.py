"""structlog events, `configure_logging`, and the engine's counters."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from pageruntime import SamplingParams, configure_logging
from pageruntime import stats as stats_module
from pageruntime.testing import reference_output

CORE_FIELDS = {"request_id", "step", "num_tokens", "num_pages"}


def test_a_request_logs_its_life_once_per_event(make_engine) -> None:
    engine = make_engine(prefill_step=8)
    with capture_logs() as logs:
        engine.generate([list(range(20))], SamplingParams(max_new_tokens=3))
    assert [(e["event"], e["step"]) for e in logs] == [
        ("request_admitted", 0),
        ("prefill_chunk", 0),
        ("prefill_chunk", 1),
        ("prefill_chunk", 2),
        ("first_token", 2),
        ("request_finished", 4),
    ]
    assert all(e.keys() >= CORE_FIELDS and e["request_id"] == 0 for e in logs)
    admitted, *chunks, first, finished = logs
    assert (admitted["num_tokens"], admitted["num_pages"], admitted["resumed"]) == (20, 5, False)
    assert [(c["num_tokens"], c["num_pages"], c["context_len"]) for c in chunks] == [
        (8, 2, 8),
        (8, 4, 16),
        (4, 5, 20),
    ]
    expected = reference_output(list(range(20)), SamplingParams(max_new_tokens=3), max_seq_len=256)
    assert (first["token"], first["num_tokens"]) == (expected[0], 21)
    # Released: 22 tokens (the last output is never fed back) in 6 pages of 4.
    assert (finished["num_tokens"], finished["num_pages"]) == (3, 6)
    assert finished["finish_reason"] == "length" and finished["log_level"] == "info"


def _run_a_request(make_engine) -> None:
    make_engine().generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))


def test_json_logging_writes_one_object_per_event_to_stderr(make_engine, capsys) -> None:
    configure_logging("json")
    _run_a_request(make_engine)
    out, err = capsys.readouterr()
    events = [json.loads(line) for line in err.splitlines()]
    assert [e["event"] for e in events] == [
        "request_admitted",
        "prefill_chunk",
        "first_token",
        "request_finished",
    ]
    assert all(e.keys() >= CORE_FIELDS and "timestamp" in e for e in events)
    assert events[0]["level"] == "info" and out == ""


def test_console_logging_writes_readable_lines_to_stderr(make_engine, capsys) -> None:
    configure_logging("console")
    _run_a_request(make_engine)
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 4 and "request_finished" in err and out == ""


def test_quiet_logging_writes_nothing(make_engine, capsys) -> None:
    configure_logging()
    _run_a_request(make_engine)
    assert capsys.readouterr() == ("", "")


def test_configure_logging_rejects_unknown_formats() -> None:
    with pytest.raises(ValueError, match="'console', 'json' or 'quiet'"):
        configure_logging("xml")  # type: ignore[arg-type]


def test_stats_keep_the_latest_step_times_only(monkeypatch, make_engine) -> None:
    """A long-running engine keeps a window of step times, not one per step ever run."""
    monkeypatch.setattr(stats_module, "STEP_TIMES_KEPT", 3)
    engine = make_engine(num_pages=32, max_batch_size=1, prefill_step=8)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=6))
    stats = engine.stats
    assert stats.steps == 6 and len(stats.step_times) == 3  # 1 prefill + 5 decode steps


def test_stats_count_steps_tokens_and_pages(make_engine) -> None:
    engine = make_engine(num_pages=32, max_batch_size=4, prefill_step=8)
    prompts = [list(range(n, n + 9)) for n in range(5)]
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=7))
    stats = engine.stats
    assert stats.steps == len(stats.step_times) > 0
    assert all(seconds > 0 for seconds in stats.step_times)
    assert stats.prefill_tokens == sum(len(p) for p in prompts)
    # The first token of each request comes from its last prefill chunk.
    assert stats.decode_tokens == sum(len(o.output_ids) - 1 for o in outputs)
    assert stats.requests_finished == 5 and stats.requests_failed == stats.preemptions == 0
    assert stats.peak_live_pages == stats.pool.peak_live_pages
    # Four running requests, each holding ceil(15 / 4) = 4 pages at most.
    assert 4 * 3 < stats.peak_live_pages <= 16
    assert stats.pool.num_live_pages == 0
    with pytest.raises(AttributeError):
        stats.steps = 0  # type: ignore[misc]
