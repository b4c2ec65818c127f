"""Memory-capped admission sweep: how many requests run at once under a fixed KV byte budget.

For each budget (pool pages), the serve-bench trace is served by the paged path with both
admission policies (`reserve`: prompt + max tokens up front; `optimistic`: the prompt, preempting
when full) with no batch-size cap, so memory alone limits concurrency. The dense baseline must
reserve prompt + max tokens contiguously for the longest request it may get, so the same bytes
hold floor(budget / (max_input_len + max_output_len) tokens) requests; it runs at that batch size.

    python3 benchmarks/admission_sweep.py --device gpu --json-output out/admission.json
    .venv/bin/python benchmarks/admission_sweep.py --device cpu --model synthetic:qwen3-tiny \
        --num-seqs 6 --budgets 1 2 --budget-unit requests
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from pageruntime import configure_logging
from qwen3model import load_model
from qwen3model.commands import DEFAULT_CPU_MODEL, DEFAULT_GPU_MODEL
from qwen3model.provenance import collect_provenance
from qwen3model.serving import TRACE_OVERRIDES, make_requests, run_variant, serve_bench_trace

# 2: concurrency (peak/mean decode rows) moved from each row into its `result`.
SCHEMA = "paged-serving/admission-sweep/2"
# The trace flags of serve-bench but the batch size, which memory sets here.
TRACE_FLAGS = tuple(name for name in TRACE_OVERRIDES if name != "batch_size")


def token_bytes(model) -> int:
    """K + V bytes one token occupies across all layers."""
    args = model.args
    return 2 * args.num_hidden_layers * args.num_key_value_heads * args.head_dim * model.dtype.size


def dense_slots(budget_bytes: int, trace, model) -> int:
    """Requests a dense cache fits in `budget_bytes` when each reserves the longest request."""
    longest = trace.max_input_len + trace.max_output_len
    return budget_bytes // (longest * token_bytes(model))


def _run(model, variant: str, trace, requests, **engine) -> dict:
    try:
        result = run_variant(model, variant, trace, requests, **engine)
    except RuntimeError as error:
        return {"status": "failed", "error": str(error)}
    return {"status": "ok", "result": dataclasses.asdict(result)}


def run_sweep(
    model,
    trace,
    requests,
    budgets: list[int],
    *,
    max_batch_size: int,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
) -> list[dict]:
    """Serves `requests` at every budget (pages): paged x {reserve, optimistic}, then dense.

    Args:
        on_row: Called with all rows so far after each run (the command writes its JSON there,
            so a sweep cut short keeps what it measured).

    Returns:
        One row per (budget, variant, policy) with the concurrency limit and the
        `ServingResult` fields, concurrency included (or `status` "failed"/"does_not_fit").
    """
    page_bytes = trace.page_size * token_bytes(model)
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        print(
            f"budget {row['budget_pages']} pages: {row['variant']}/{row['policy']} "
            f"x{row['max_batch_size']}: {row['status']}",
            file=sys.stderr,
        )
        on_row(rows)

    for pages in budgets:
        common = {"budget_pages": pages, "budget_bytes": pages * page_bytes}
        paged_trace = dataclasses.replace(trace, batch_size=max_batch_size)
        for policy in ("reserve", "optimistic"):
            run = _run(model, "paged", paged_trace, requests, admission=policy, num_pages=pages)
            add(
                {
                    **common,
                    "variant": "paged",
                    "policy": policy,
                    "max_batch_size": max_batch_size,
                    **run,
                }
            )
        slots = min(dense_slots(pages * page_bytes, trace, model), max_batch_size)
        dense = {
            **common,
            "variant": "dense",
            "policy": "reserve-max-length",
            "max_batch_size": slots,
        }
        if slots == 0:
            add({**dense, "status": "does_not_fit"})
            continue
        dense_trace = dataclasses.replace(trace, batch_size=slots)
        add(
            {
                **dense,
                **_run(model, "dense", dense_trace, requests),  # pages: slots x longest request
            }
        )
    return rows


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device", choices=("cpu", "gpu"), default="gpu" if mx.cuda.is_available() else "cpu"
    )
    parser.add_argument(
        "--model",
        help=f"qwen3model source (default: {DEFAULT_GPU_MODEL} GPU, {DEFAULT_CPU_MODEL} CPU)",
    )
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--kernel-backend", default="native")
    parser.add_argument("--budgets", nargs="+", type=float, default=[1, 2, 4, 8])
    parser.add_argument(
        "--budget-unit",
        choices=("requests", "pages"),
        default="requests",
        help="requests: multiples of one longest request's pages",
    )
    for name in TRACE_FLAGS:
        flag = name.replace("_", "-")
        parser.add_argument(f"--{flag}", type=int, help="default: as qwen3model serve-bench")
    parser.add_argument("--max-batch-size", type=int, help="cap on running requests (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed (as serve-bench)")
    parser.add_argument("--weights-seed", type=int, default=0)
    parser.add_argument("--log-format", choices=("quiet", "console", "json"), default="quiet")
    parser.add_argument("--json-output", type=Path)
    return parser


def _document(args, model, trace, budgets: list[int], rows: list[dict], seconds: float) -> dict:
    return {
        "schema": SCHEMA,
        "kind": "admission_sweep",
        "provenance": collect_provenance(args.device),
        "model": {
            "source": args.model,
            "dtype": str(model.dtype),
            "kernel_backend": args.kernel_backend,
            "kv_bytes_per_token": token_bytes(model),
        },
        "trace": dataclasses.asdict(trace),
        "budgets_pages": budgets,
        "dense_rule": (
            "slots = budget_bytes // ((max_input_len + max_output_len) * kv_bytes_per_token)"
        ),
        "sweep_seconds": seconds,
        "complete": len(rows) == 3 * len(budgets),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    args = setup_arg_parser().parse_args(argv)
    configure_logging(args.log_format)
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    on_gpu = args.device == "gpu"
    args.model = args.model or (DEFAULT_GPU_MODEL if on_gpu else DEFAULT_CPU_MODEL)
    overrides = {name: getattr(args, name) for name in TRACE_FLAGS}
    trace = serve_bench_trace(on_gpu=on_gpu, seed=args.seed, **overrides)
    dtype = getattr(mx, args.dtype) if args.dtype else None
    model, _ = load_model(
        args.model, kernel_backend=args.kernel_backend, dtype=dtype, seed=args.weights_seed
    )
    requests = make_requests(trace, model.args.vocab_size)
    longest_pages = trace.longest_request_pages
    unit = longest_pages if args.budget_unit == "requests" else 1
    budgets = sorted({max(longest_pages, round(b * unit)) for b in args.budgets})
    warm_trace = dataclasses.replace(
        trace,
        num_seqs=1,
        batch_size=1,
        min_output_len=2,
        max_input_len=trace.min_input_len,
        max_output_len=2,
    )
    warm = make_requests(warm_trace, model.args.vocab_size)
    for variant in ("paged", "dense"):  # compile kernels and grow allocators outside the sweep
        run_variant(model, variant, warm_trace, warm)
    start = time.perf_counter()

    def write(rows: list[dict]) -> None:
        if args.json_output:
            document = _document(args, model, trace, budgets, rows, time.perf_counter() - start)
            args.json_output.parent.mkdir(parents=True, exist_ok=True)
            args.json_output.write_text(json.dumps(document, indent=1))

    max_batch_size = args.max_batch_size or trace.num_seqs
    rows = run_sweep(model, trace, requests, budgets, max_batch_size=max_batch_size, on_row=write)
    print(format_rows(rows))
    return 0 if all(r["status"] != "failed" for r in rows) else 1


def format_rows(rows: list[dict]) -> str:
    """A text table: budget, variant/policy, concurrency and throughput."""
    lines = [
        f"{'pages':>6} {'variant':<26} {'cap':>4} {'peak rows':>9} {'mean rows':>9} "
        f"{'out tok/s':>10} {'req/s':>7} {'preempt':>7} {'peak KV MiB':>11}"
    ]
    for row in rows:
        name = f"{row['variant']}/{row['policy']}"
        if row["status"] != "ok":
            lines.append(
                f"{row['budget_pages']:>6} {name:<26} {row['max_batch_size']:>4} {row['status']}"
            )
            continue
        r = row["result"]
        lines.append(
            f"{row['budget_pages']:>6} {name:<26} {row['max_batch_size']:>4} "
            f"{r['peak_decode_rows']:>9} {r['mean_decode_rows']:>9.2f} "
            f"{r['output_tokens_per_s']:>10.1f} {r['requests_per_s']:>7.3f} "
            f"{r['preemptions']:>7} {r['peak_kv_bytes'] / 2**20:>11.1f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
