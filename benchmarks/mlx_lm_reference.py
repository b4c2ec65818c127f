"""The outside reference for serve-bench: mlx-lm's `BatchGenerator` on the same trace and shapes.

Builds `mlx_lm.models.qwen3.Model` with the shapes of one of qwen3model's synthetic configs and
random weights (mlx.nn's initialisers, cast to the dtype), draws the serve-bench trace with
`qwen3model.serving.make_requests` (same lengths, prompt tokens and seed), and serves it with
continuous batching at the same batch size and prefill step. The trace defaults to serve-bench's
on the device it runs on (`serve_bench_trace`). No stop tokens: every request generates exactly
its `max_new_tokens`, as in serve-bench. mlx-lm is not a project dependency: install its
pure-Python wheel beside MLX first (`pip install --no-deps mlx-lm==0.32.2`; it imports
`transformers` at module load).

    python3 benchmarks/mlx_lm_reference.py --device gpu --json-output out/mlx_lm.json

The JSON has serve-bench's layout (`trace`, `context`, `provenance`, `results`), so
`benchmarks/plot.py` draws it like a serve-bench file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx

from qwen3model.provenance import collect_provenance

__all__ = ["build_model", "serve_trace"]


def build_model(name: str, dtype: mx.Dtype):
    """`mlx_lm.models.qwen3.Model` with the shapes of `qwen3model`'s synthetic config `name`."""
    from mlx_lm.models import qwen3

    from qwen3model import SYNTHETIC_CONFIGS

    ours = SYNTHETIC_CONFIGS[name]
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=ours.hidden_size,
        num_hidden_layers=ours.num_hidden_layers,
        intermediate_size=ours.intermediate_size,
        num_attention_heads=ours.num_attention_heads,
        rms_norm_eps=ours.rms_norm_eps,
        vocab_size=ours.vocab_size,
        num_key_value_heads=ours.num_key_value_heads,
        max_position_embeddings=ours.max_position_embeddings,
        head_dim=ours.head_dim,
        tie_word_embeddings=ours.tie_word_embeddings,
        rope_theta=ours.rope_theta,
    )
    model = qwen3.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def serve_trace(model, requests, *, batch_size: int, prefill_step: int) -> dict:
    """Serves `requests` (qwen3model `TraceRequest`s) through one `BatchGenerator`.

    Returns:
        serve-bench's `ServingResult` fields where mlx-lm measures them (decode step time is the
        mean, as its counters keep only totals), plus `peak_kv_bytes` (largest allocated K/V
        seen after a step) and `peak_memory_bytes` (MLX's process peak).
    """
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(
        model,
        completion_batch_size=batch_size,
        prefill_batch_size=batch_size,
        prefill_step_size=prefill_step,
    )
    generator.insert(
        [list(r.prompt_ids) for r in requests], max_tokens=[r.max_new_tokens for r in requests]
    )
    unfinished, peak_kv, step_counts = len(requests), 0, []
    mx.reset_peak_memory()
    start = time.perf_counter()
    with generator.stats() as stats:
        while unfinished:
            _, generated = generator.next()
            unfinished -= sum(r.finish_reason is not None for r in generated)
            if generated:
                step_counts.append(len(generated))
            peak_kv = max(peak_kv, generator.prompt_cache_nbytes)
    wall = time.perf_counter() - start
    generator.close()
    steps = max(stats.generation_steps, 1)
    return {
        "variant": f"mlx-lm {version('mlx-lm')} BatchGenerator",
        "num_requests": len(requests),
        "prefill_tokens": stats.prompt_tokens,
        "output_tokens": stats.generation_tokens,
        "wall_s": wall,
        "prefill_tokens_per_s": stats.prompt_tps,
        "output_tokens_per_s": stats.generation_tokens / wall,
        "decode_tokens_per_s": stats.decode_tps,
        "requests_per_s": len(requests) / wall,
        "mean_decode_step_ms": 1000 * stats.decode_time / steps,
        "mean_decode_rows": statistics.fmean(step_counts) if step_counts else 0.0,
        "peak_kv_bytes": peak_kv,
        "copied_bytes": None,
        "peak_memory_bytes": mx.get_peak_memory(),
    }


def main(argv: list[str] | None = None) -> int:
    from qwen3model.serving import TRACE_OVERRIDES, make_requests, serve_bench_trace

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    on_gpu = mx.cuda.is_available()
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu" if on_gpu else "cpu")
    parser.add_argument("--model", default=None, help="synthetic config (qwen3-4b on GPU)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"))
    for name in TRACE_OVERRIDES:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, help="default: as qwen3model serve-bench")
    parser.add_argument("--seed", type=int, default=0, help="trace seed (as serve-bench)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests first")
    parser.add_argument("--json-output", type=Path)
    args = parser.parse_args(argv)
    on_gpu = args.device == "gpu"
    mx.set_default_device(mx.gpu if on_gpu else mx.cpu)
    name = args.model or ("qwen3-4b" if on_gpu else "qwen3-small")
    dtype_name = args.dtype or ("bfloat16" if on_gpu else "float32")
    model = build_model(name, getattr(mx, dtype_name))
    overrides = {name: getattr(args, name) for name in TRACE_OVERRIDES}
    trace = serve_bench_trace(on_gpu=on_gpu, seed=args.seed, **overrides)
    requests = make_requests(trace, model.args.vocab_size)
    if args.warmup:
        warm = dataclasses.replace(
            trace,
            num_seqs=args.warmup,
            max_input_len=trace.min_input_len,
            max_output_len=4,
            min_output_len=4,
            seed=trace.seed + 1,
        )
        serve_trace(
            model,
            make_requests(warm, model.args.vocab_size),
            batch_size=trace.batch_size,
            prefill_step=trace.prefill_step,
        )
    result = serve_trace(
        model, requests, batch_size=trace.batch_size, prefill_step=trace.prefill_step
    )
    document = {
        "trace": dataclasses.asdict(trace),
        "context": {
            "model": f"synthetic:{name} (mlx-lm, random weights)",
            "dtype": dtype_name,
            "device": args.device,
            "mlx_lm_version": version("mlx-lm"),
        },
        "provenance": collect_provenance(args.device),
        "results": [result],
    }
    if args.json_output:
        args.json_output.parent.mkdir(parents=True, exist_ok=True)
        args.json_output.write_text(json.dumps(document, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
