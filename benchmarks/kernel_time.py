"""GPU time per attention call, from the kernels the call launches (CUPTI), calls in a chain.

The operator benchmark (`attention.py`) reports wall time per call over independent calls
evaluated together. At small decode shapes that is MLX's host cost per operation (several us,
which moves between machines and processes), and the GPU may run the independent calls' kernels
at the same time, so it is a throughput figure. This script measures latency on the GPU: each
call's queries are the previous call's output, as one layer's attention follows the last one's,
so the calls run one after another, and the kernels are traced with PyTorch's profiler over
`--calls` such calls. Per call it reports the summed kernel durations (the attention kernel, and
the split merge when the planner splits the keys) and the span from the first kernel's start to
the last one's end (kernels plus the GPU's gaps between dependent launches).

A shape's cells are paged at each page size and MLX SDPA once (on K/V gathered from the
smallest page size). Every cell gates against the readable reference first (2e-2), then runs
`--rounds` rounds; a round traces every cell of the shape, in alternating order. The calls
rotate among enough K/V copies to read them from memory, not L2. Needs the GPU and PyTorch
(the lent H200 has both).

Decode only: a prefill chain feeds each call the previous output, whose small values send our
softmax down its cheap path on every tile and lower the tensor cores' power draw (both kernels
ran faster than on random inputs), so prefill is compared on fresh random inputs by
`attention.py`. `--decode-splits N` forces the
CUDA decode kernel's key chunks (0: the planner's choice), as in `attention.py`.

    python benchmarks/kernel_time.py --batches 1 8 --contexts 128 1024 8192 \
        --page-sizes 16 128 --json-output kernel_time.json
    python benchmarks/kernel_time.py --paths paged --decode-splits 4 --batches 8 --contexts 8192
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import statistics
import sys
from pathlib import Path

import mlx.core as mx
from attention_workload import (
    Shape,
    attention_call,
    check_gate,
    derive_copy,
    make_paged_inputs,
    sdpa_inputs,
)
from batch_timer import GPU_L2_BYTES, plan_batches
from cupti_trace import kernel_events, trace_events

from pagekernels import get_backend
from qwen3model.provenance import collect_provenance

PATHS = ("paged", "sdpa")
MEMORY_BUDGET = 8 * 10**9  # input copies per cell


class _Cell:
    """One (path, page size) of a shape: its lazy call and the input copies it rotates among.

    The sdpa path's copies are dense K/V gathered from pool copies, one pool at a time.
    """

    def __init__(self, path: str, shape: Shape, backend, reference) -> None:
        first = make_paged_inputs(shape, seed=1)
        expected = attention_call("paged", reference, shape)(first)
        pool_bytes = first.key_pages.nbytes + first.value_pages.nbytes
        plan = plan_batches(
            copy_bytes=shape.kv_bytes if path == "sdpa" else pool_bytes,
            transient_bytes=shape.qo_bytes,
            cache_bytes=GPU_L2_BYTES,
            memory_budget=MEMORY_BUDGET,
            max_calls=1,
        )
        pools = itertools.chain([first], (derive_copy(first, i) for i in range(1, plan.copies)))
        if path == "sdpa":
            self.inputs = [sdpa_inputs(reference, x, shape) for x in pools]
        else:
            self.inputs = list(pools)
        self.call = attention_call(path, backend, shape)
        self.gate = check_gate(self.call(self.inputs[0]), expected, shape.dtype)
        if not self.gate["ok"]:
            raise SystemExit(f"{shape.label()} {path}: failed the gate {self.gate}")
        self._next = 0

    def calls(self, count: int) -> mx.array:
        """The last of `count` chained lazy calls: each on the next K/V copy (reused only after
        all the others), its queries the previous call's output."""
        out = None
        for _ in range(count):
            x = self.inputs[self._next]
            if out is not None:
                x = (out, *x[1:]) if isinstance(x, tuple) else dataclasses.replace(x, queries=out)
            out = self.call(x)
            self._next = (self._next + 1) % len(self.inputs)
        return out


def kernel_us_per_call(cell: _Cell, calls: int) -> dict[str, object]:
    """Kernels per call, their GPU microseconds per call (in total and by kernel name) and the
    span of the chain per call."""
    mx.eval(cell.calls(calls))  # warm-up, untraced
    launched = kernel_events(trace_events(lambda: mx.eval(cell.calls(calls))))
    if not launched:
        raise RuntimeError("the profiler recorded no GPU kernel (is CUPTI available?)")
    by_name: dict[str, float] = collections.defaultdict(float)
    for event in launched:
        by_name[event["name"]] += event["dur"] / calls
    span = max(e["ts"] + e["dur"] for e in launched) - launched[0]["ts"]
    return {
        "us": sum(by_name.values()),
        "span_us": span / calls,
        "kernels": len(launched) / calls,
        "by_kernel": dict(sorted(by_name.items(), key=lambda kv: -kv[1])),
    }


def _median_by_kernel(samples: list[dict]) -> dict[str, float]:
    """Each kernel's median us per call over the samples (0 where a sample lacks it)."""
    names = {name for s in samples for name in s["by_kernel"]}
    medians = {n: statistics.median(s["by_kernel"].get(n, 0.0) for s in samples) for n in names}
    return dict(sorted(medians.items(), key=lambda kv: -kv[1]))


def time_shape(
    batch: int,
    context: int,
    page_sizes: list[int],
    *,
    paths: tuple[str, ...] = PATHS,
    calls: int,
    rounds: int,
) -> list[dict[str, object]]:
    """Every cell of one decode shape: paged at each page size, sdpa once (its dense K/V do not
    depend on the page size; gathered from the smallest)."""
    backend, reference = get_backend("native"), get_backend("reference")
    shapes = {ps: Shape(batch=batch, context=context, page_size=ps) for ps in page_sizes}
    keys = [("paged", ps) for ps in page_sizes] if "paged" in paths else []
    keys += [("sdpa", min(page_sizes))] if "sdpa" in paths else []
    cells = {(path, ps): _Cell(path, shapes[ps], backend, reference) for path, ps in keys}
    samples: dict[tuple[str, int], list[dict]] = {key: [] for key in cells}
    order = list(cells)
    for round_ in range(rounds):
        for key in order if round_ % 2 == 0 else order[::-1]:
            samples[key].append(kernel_us_per_call(cells[key], calls))
    results = []
    for (path, ps), cell in cells.items():
        us = [s["us"] for s in samples[path, ps]]
        span = [s["span_us"] for s in samples[path, ps]]
        results.append(
            {
                "path": path,
                "shape": shapes[ps].to_dict(),
                "label": shapes[ps].label(),
                "gate": cell.gate,
                "copies": len(cell.inputs),
                "calls_per_sample": calls,
                "median_kernel_us": statistics.median(us),
                "samples_kernel_us": us,
                "median_span_us": statistics.median(span),
                "samples_span_us": span,
                "kernels_per_call": statistics.median(s["kernels"] for s in samples[path, ps]),
                "by_kernel_us": _median_by_kernel(samples[path, ps]),
            }
        )
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 8192])
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument(
        "--decode-splits", type=int, default=0, help="CUDA decode key chunks (0 = the planner's)"
    )
    parser.add_argument("--calls", type=int, default=32, help="calls traced per sample")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json-output", type=Path)
    args = parser.parse_args(argv)
    if not mx.cuda.is_available():
        raise SystemExit("needs MLX's CUDA backend and PyTorch (CUPTI)")
    mx.set_default_device(mx.gpu)
    from pagekernels import _ext

    _ext.set_decode_num_splits(args.decode_splits)
    results = []
    for batch, context in itertools.product(args.batches, args.contexts):
        shape_results = time_shape(
            batch,
            context,
            args.page_sizes,
            paths=tuple(args.paths),
            calls=args.calls,
            rounds=args.rounds,
        )
        results += shape_results
        cells = "  ".join(
            f"{r['path']} ps{r['shape']['page_size']} {r['median_kernel_us']:6.2f}"
            f" ({r['median_span_us']:6.2f})"
            for r in shape_results
        )
        print(f"decode B={batch} ctx={context}: GPU us per call (span)  {cells}", flush=True)
    if args.json_output:
        record = {
            "kind": "kernel_time",
            "provenance": collect_provenance("gpu"),
            "method": " ".join(__doc__.split("\n\n")[1:3]),
            "decode_splits": args.decode_splits,
            "results": results,
        }
        args.json_output.parent.mkdir(parents=True, exist_ok=True)
        args.json_output.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
