"""Operator benchmark: the seed's three attention paths on Qwen3-4B shapes, plus `write_kv`.

Paths: `dense` (pages gathered by `gather_kv`, then our `dense_attention`; the gather alone is
reported as `gather`), `paged` (the direct `paged_attention` kernel) and `sdpa` (MLX's
`mx.fast.scaled_dot_product_attention` on the already gathered K/V), on 32 query heads, 8 K/V
heads, D = 128, over a grid of batch x context x page size for decode (L = 1) and causal
prefill (B = 1, L = context). `write` times `write_kv` for one decode step of B tokens, beside
`write_functional` (copy the pool, then scatter: what `write_kv` avoids).

Every (repeat, path) runs in a fresh process (`--worker`), paths in alternating order; every cell
is gated against `pagekernels`' readable reference before it is timed. See docs/performance.md.

    python3 benchmarks/attention.py --device gpu --json-output out/attention.json
    python3 benchmarks/attention.py --device gpu --quick    # a small grid (the CPU's default)
    .venv/bin/python benchmarks/attention.py --device cpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from attention_report import aggregate, format_table, summary_rows
from attention_worker import WorkerConfig, run_worker
from attention_workload import ATTENTION_PATHS, TOLERANCE, Shape
from batch_timer import GPU_L2_BYTES, METHOD

from qwen3model.provenance import collect_provenance

SCHEMA = "paged-serving/attention-benchmark/1"
PATHS = (*ATTENTION_PATHS, "write")
# Per device: the full grid of the issue on the GPU, a small one on the CPU (its kernels take ms).
DEFAULTS = {
    "gpu": dict(
        batches=[1, 8, 32],
        contexts=[128, 1024, 8192, 32768],
        page_sizes=[16, 128],
        prefill=[128, 1024, 4096],
        warmup=3,
        iterations=15,
        repeats=3,
        max_calls=50,
        memory_budget_gb=24.0,
        cache_mb=GPU_L2_BYTES / 1e6,
    ),
    "cpu": dict(
        batches=[1, 4],
        contexts=[128, 1024],
        page_sizes=[16],
        prefill=[128],
        warmup=1,
        iterations=10,
        repeats=2,
        max_calls=2,
        memory_budget_gb=1.0,
        cache_mb=32.0,
    ),
}
QUICK = dict(batches=[1, 4], contexts=[128, 1024], page_sizes=[16], prefill=[128], repeats=2)


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_device = "gpu" if mx.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cpu", "gpu"), default=default_device)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small grid, 2 repeats (smoke test; the CPU's defaults already are this grid)",
    )
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--batches", nargs="+", type=int)
    parser.add_argument("--contexts", nargs="+", type=int)
    parser.add_argument("--page-sizes", nargs="+", type=int)
    parser.add_argument("--prefill", nargs="*", type=int, help="prefill lengths (none: skip)")
    parser.add_argument("--write-context", type=int, default=1024, help="pool context for write")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bfloat16")
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, help="untimed batches per cell and process")
    parser.add_argument("--iterations", type=int, help="timed batches per cell and process")
    parser.add_argument("--repeats", type=int, help="fresh processes per path")
    parser.add_argument("--max-calls", type=int, help="most calls evaluated per timed batch")
    parser.add_argument("--memory-budget-gb", type=float, help="input copies + transients")
    parser.add_argument("--cache-mb", type=float, help="cache to defeat (GPU: the 50 MB L2)")
    parser.add_argument("--reuse-factor", type=int, default=4, help="bytes between reuses / cache")
    parser.add_argument("--backend", default="native", help="pagekernels backend under test")
    parser.add_argument("--reference", default="reference", help="pagekernels oracle backend")
    parser.add_argument(
        "--decode-splits",
        type=int,
        default=0,
        help="force the CUDA decode attention into this many key chunks (0: the planner's)",
    )
    parser.add_argument(
        "--prefill-kernel",
        choices=["auto", "mma_sync", "wgmma"],
        default="auto",
        help="CUDA kernel of 128-row prefill tiles (wgmma: Hopper only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cooldown-seconds", type=float, default=0.0)
    parser.add_argument("--time-limit-s", type=float, help="start no new process after this")
    parser.add_argument("--process-timeout-s", type=float, help="kill a worker after this")
    parser.add_argument("--json-output", type=Path)
    parser.add_argument("--worker", metavar="CONFIG_JSON", help=argparse.SUPPRESS)
    return parser


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fills unset options from the device defaults (and --quick)."""
    defaults = {**DEFAULTS[args.device], **(QUICK if args.quick else {})}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def build_cells(args: argparse.Namespace, path: str) -> list[Shape]:
    """The shapes one path's process measures."""
    common = dict(
        heads_q=args.heads_q, heads_kv=args.heads_kv, head_dim=args.head_dim, dtype=args.dtype
    )
    if path == "write":
        return [
            Shape(batch=b, context=args.write_context, page_size=ps, **common)
            for ps in args.page_sizes
            for b in args.batches
        ]
    decode = [
        Shape(batch=b, context=ctx, page_size=ps, **common)
        for ps in args.page_sizes
        for b in args.batches
        for ctx in args.contexts
    ]
    prefill = [
        Shape(batch=1, context=n, page_size=ps, query_len=n, **common)
        for ps in args.page_sizes
        for n in args.prefill
    ]
    return decode + prefill


def _worker_config(args: argparse.Namespace, path: str, seed: int) -> WorkerConfig:
    return WorkerConfig(
        path=path,
        cells=tuple(build_cells(args, path)),
        device=args.device,
        backend=args.backend,
        reference=args.reference,
        seed=seed,
        warmup=args.warmup,
        iterations=args.iterations,
        max_calls=args.max_calls,
        memory_budget=int(args.memory_budget_gb * 1e9),
        cache_bytes=int(args.cache_mb * 1e6),
        reuse_factor=args.reuse_factor,
        decode_splits=args.decode_splits,
        prefill_kernel=args.prefill_kernel,
    )


def _run_process(cfg: WorkerConfig, timeout: float | None) -> tuple[list[dict], int, float]:
    """Runs one fresh worker process; returns its records, exit code and wall seconds.

    A worker past `timeout` seconds is killed; the cells it finished are kept (exit code -9).
    """
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", cfg.to_json()]
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout)
        stdout, returncode = done.stdout, done.returncode
    except subprocess.TimeoutExpired as expired:
        stdout, returncode = expired.stdout or "", -9
        if isinstance(stdout, bytes):
            stdout = stdout.decode()
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return records, returncode, time.perf_counter() - start


def _document(args: argparse.Namespace, records: list[dict], processes: list[dict], complete: bool):
    cells = aggregate(records)
    return {
        "schema": SCHEMA,
        "kind": "attention",
        "provenance": collect_provenance(args.device),
        "method": {
            "description": METHOD,
            "warmup_batches": args.warmup,
            "timed_batches": args.iterations,
            "repeats": args.repeats,
            "max_calls_per_batch": args.max_calls,
            "memory_budget_bytes": int(args.memory_budget_gb * 1e9),
            "cache_bytes": int(args.cache_mb * 1e6),
            "reuse_factor": args.reuse_factor,
            "backend": args.backend,
            "reference": args.reference,
            "gate": {"tolerance": TOLERANCE, "rule": "allclose(rtol=atol=tolerance) vs reference"},
            "bandwidth": "bytes the operation must move / median time (*_gbps = *_bytes / s / 1e9)",
        },
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "json_output")},
        "complete": complete,
        "processes": processes,
        "cells": cells,
        "summary": summary_rows(cells),
    }


def main(argv: list[str] | None = None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if args.worker:
        return run_worker(WorkerConfig.from_json(args.worker))
    args = _resolve(args)
    start, records, processes, complete = time.perf_counter(), [], [], True
    for repeat in range(args.repeats):
        order = args.paths if repeat % 2 == 0 else args.paths[::-1]
        for position, path in enumerate(order):
            if args.time_limit_s and time.perf_counter() - start > args.time_limit_s:
                complete = False
                break
            seed = args.seed + 1000 * repeat + PATHS.index(path)
            cfg = _worker_config(args, path, seed)
            found, returncode, seconds = _run_process(cfg, args.process_timeout_s)
            for record in found:
                record.update(repeat=repeat, order=position)
            records += found
            processes.append(
                dict(
                    repeat=repeat,
                    order=position,
                    path=path,
                    seed=seed,
                    returncode=returncode,
                    seconds=seconds,
                )
            )
            print(
                f"repeat {repeat} {path}: {len(found)} records, exit {returncode}, {seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            if args.json_output:  # after every process, so a cut-short run keeps its results
                document = _document(args, records, processes, complete=False)
                args.json_output.parent.mkdir(parents=True, exist_ok=True)
                args.json_output.write_text(json.dumps(document, indent=1))
            time.sleep(args.cooldown_seconds)
    document = _document(args, records, processes, complete)
    if args.json_output:
        args.json_output.write_text(json.dumps(document, indent=1))
    print(format_table(document["summary"]))
    failed = [c["label"] + " " + c["path"] for c in document["cells"] if c["status"] != "ok"]
    for name in failed:
        print(f"NOT MEASURED: {name}", file=sys.stderr)
    return 1 if failed or any(p["returncode"] for p in processes) else 0


if __name__ == "__main__":
    sys.exit(main())
