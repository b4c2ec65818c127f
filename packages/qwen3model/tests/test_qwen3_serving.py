"""The serve-bench workload: traces, requests and what `run_variant` measures."""

from __future__ import annotations

from qwen3model import AttentionMode, build_synthetic
from qwen3model.serving import Trace, make_requests, run_variant


def test_output_tokens_count_what_was_generated(backend) -> None:
    # max_seq_len 40 cuts the requests whose prompt + max_new_tokens pass it.
    model, _ = build_synthetic("qwen3-tiny", backend=backend, max_seq_len=40)
    trace = Trace(
        num_seqs=4,
        batch_size=2,
        min_input_len=20,
        max_input_len=30,
        min_output_len=12,
        max_output_len=16,
        prefill_step=16,
        page_size=8,
    )
    requests = make_requests(trace, model.vocab_size)
    expected = sum(min(r.max_new_tokens, 40 - len(r.prompt_ids)) for r in requests)
    assert expected < sum(r.max_new_tokens for r in requests)  # some request ends early
    calls: list[None] = []
    result = run_variant(
        model, AttentionMode.PAGED, trace, requests, on_token=lambda: calls.append(None)
    )
    assert result.output_tokens == len(calls) == expected
    assert result.output_tokens_per_s == result.output_tokens / result.wall_s
