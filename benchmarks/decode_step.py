"""Where one decode step's time goes: the whole step against chains of its parts.

Builds a synthetic model (random weights, no download), fills a page pool so every row of a
batch has `--context` tokens, and times, each as the median of `--steps` evaluations after a
warm-up:

- `step` / `step+compile`: `Qwen3Model.step` for one decode token per row (`L = 1`), as the
  engine runs it (uncompiled, and through `mx.compile`), each step synchronised;
- `step+compile overlapped`: steady-state time per compiled step when each step is submitted
  before the previous one is waited for, its tokens the argmax of the previous logits on the
  device (what `Engine(overlap_decode=True)` does);
- `linears`: every projection of every layer and the LM head as independent products in one
  evaluation, against the weight-streaming floor: through the backend's `linear` (the model's
  path) with `B` rows, and as `x @ W.T` with `B` rows and with one (MLX takes its GEMV kernel for
  one row and cuBLASLt otherwise); then the same per weight shape (all of the model's weights of
  that shape in one evaluation), in us per product and GB/s of weights read;
- `attention`: `write_kv` + `paged_attention` of every layer at the step's shapes (with
  `--attention-splits`, also this chain and the compiled step with the attention's keys forced
  into each given number of chunks);
- `primitives`: the uncompiled step's graph by primitive (kernels and views alike);
- `tiny ops` / `tiny views`: `--tiny-ops` dependent one-element additions, and as many reshapes
  (a primitive without a kernel), each chain one evaluation (about a Qwen3-4B step's operation
  count): MLX's per-operation cost with no work in it.

    python3 benchmarks/decode_step.py --device gpu --json-output out/decode_step.json

`--kernel-trace` (GPU, needs PyTorch in the same environment, as on the lent H200) also records
every CUDA kernel of `--steps` compiled steps through `torch.profiler` (CUPTI sees MLX's graph
launches too) and reports GPU time per step by kernel and, for the linear kernel, per launch
grid (one per weight shape): the step's kernel time against its wall time and its host time
(`step+compile host`: until `mx.async_eval` returns) separates device work from host overhead.

A step far above the sum of the weight floor and the attention chain is bounded by
per-operation overhead, not by the kernels.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from attention_workload import DTYPES
from cupti_trace import kernel_events, trace_events

from pagekernels import get_backend
from pagepool import BatchMetadata, PagePool
from qwen3model.provenance import collect_provenance
from qwen3model.synthetic import SYNTHETIC_CONFIGS, build_synthetic

__all__ = ["main"]


def _median_ms(run: Callable[[], list[mx.array]], steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        mx.eval(run())
    samples = []
    for _ in range(steps):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(run())
        samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples)


def _linear_weights(model: nn.Module) -> list[mx.array]:
    if any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules()):
        raise SystemExit("decode_step.py times float projections; the model is quantized")
    weights = [
        module.weight for _, module in model.named_modules() if isinstance(module, nn.Linear)
    ]
    if model.args.tie_word_embeddings:
        weights.append(model.model.embed_tokens.weight)
    return weights


def _kernel_trace(run: Callable[[], list[mx.array]], steps: int) -> dict[str, object]:
    """GPU kernels of `steps` evaluations of `run`: calls and microseconds per step, by kernel
    name and by (name, grid) launch shape (which tells the linear kernel's weight shapes apart),
    and where each step's wall time goes on one clock: from the step's start (building its
    graph) to its first kernel (`build_graph`: the part before `mx.eval`, the compiled call),
    the kernels' span, and from the last kernel to `mx.eval` returning."""
    from torch.profiler import record_function

    mx.eval(run())

    def traced() -> None:
        for _ in range(steps):
            with record_function("decode_step"):
                with record_function("build_graph"):
                    outputs = run()
                mx.eval(outputs)

    events = trace_events(traced)
    launched = kernel_events(events)
    step_events = sorted(
        (e for e in events if e.get("name") == "decode_step" and e.get("cat") == "user_annotation"),
        key=lambda e: e["ts"],
    )
    build = [  # microseconds, one entry per traced step
        e["dur"]
        for e in events
        if e.get("name") == "build_graph" and e.get("cat") == "user_annotation"
    ]
    lead, span, tail = [], [], []  # microseconds, one entry per traced step with kernels
    for step_event in step_events:
        start, end = step_event["ts"], step_event["ts"] + step_event["dur"]
        inside = [e for e in launched if start <= e["ts"] < end]
        if not inside:
            continue
        last_end = max(e["ts"] + e["dur"] for e in inside)
        lead.append(inside[0]["ts"] - start)
        span.append(last_end - inside[0]["ts"])  # kernels plus the GPU's gaps between them
        tail.append(end - last_end)
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    by_launch: dict[tuple[str, tuple[int, ...]], list[float]] = collections.defaultdict(list)
    for event in launched:
        grid = tuple(event.get("args", {}).get("grid", ()))
        by_name[event["name"]].append(event["dur"])
        by_launch[event["name"], grid].append(event["dur"])

    def table(groups: dict, key: Callable) -> list[dict[str, object]]:
        rows = [
            {**key(k), "calls": len(durations) / steps, "us": sum(durations) / steps}
            for k, durations in groups.items()
        ]
        return sorted(rows, key=lambda row: -row["us"])

    kernels = table(by_name, lambda name: {"kernel": name})
    return {
        "kernel_us_per_step": sum(k["us"] for k in kernels),
        "step_timeline_us": {
            "start_to_first_kernel": statistics.median(lead) if lead else None,
            "build_graph": statistics.median(build) if build else None,
            "first_to_last_kernel": statistics.median(span) if span else None,
            "last_kernel_to_eval_return": statistics.median(tail) if tail else None,
        },
        "kernels_per_step": sum(k["calls"] for k in kernels),
        "kernels": kernels,
        "launches": table(by_launch, lambda k: {"kernel": k[0], "grid": list(k[1])}),
    }


def _primitive_counts(outputs: list[mx.array]) -> dict[str, int]:
    """The primitives of the graph behind `outputs` (before evaluation), by name."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(path), *outputs)
        names = re.findall(r'label ="([A-Za-z]+)', path.read_text())
    return dict(collections.Counter(names).most_common())


def _host_and_wall_ms(run: Callable[[], list[mx.array]], steps: int) -> tuple[float, float]:
    """Medians of the host's share (building the graph and submitting it: `mx.async_eval`
    returns) and of the whole evaluation, over `steps` runs after the warm-up `_median_ms`
    uses."""
    for _ in range(3):
        mx.eval(run())
    host, wall = [], []
    for _ in range(steps):
        mx.synchronize()
        start = time.perf_counter()
        outputs = run()
        mx.async_eval(outputs)
        submitted = time.perf_counter()
        mx.eval(outputs)
        done = time.perf_counter()
        host.append(1000 * (submitted - start))
        wall.append(1000 * (done - start))
    return statistics.median(host), statistics.median(wall)


def _split_sweep(
    counts: list[int],
    attention: Callable[[], list[mx.array]],
    step: Callable[[], list[mx.array]],
    model: nn.Module,
    steps: int,
    kernel_trace: bool,
) -> dict[str, dict[str, float]]:
    """The attention chain and the compiled step's wall time with the decode attention forced
    into each of `counts` key chunks (the CUDA kernels' test knob), by count; with
    `kernel_trace`, also the step's GPU time in the attention and split-merge kernels."""
    if not counts:
        return {}
    from pagekernels import _ext, with_cuda

    if not with_cuda:
        raise SystemExit("--attention-splits needs pagekernels built with PAGEKERNELS_CUDA=1")
    sweep = {}
    model.compile_decode = True
    try:
        for count in counts:
            _ext.set_decode_num_splits(count)
            sweep[str(count)] = {
                "attention": _median_ms(attention, steps),
                "step+compile": _host_and_wall_ms(step, steps)[1],
            }
            if kernel_trace:
                kernels = _kernel_trace(step, steps)["kernels"]
                sweep[str(count)]["attention kernels"] = 1e-3 * sum(
                    k["us"] for k in kernels if re.search("attention|merge_splits", k["kernel"])
                )
    finally:
        _ext.set_decode_num_splits(0)
        model.compile_decode = False
    return sweep


def _overlapped_ms(step: Callable[[mx.array], mx.array], tokens: mx.array, steps: int) -> float:
    """Steady-state ms per step when each step is submitted before the previous one is waited
    for, as `Engine(overlap_decode=True)` runs decode steps: `step(tokens)` returns the next
    tokens (on the device, not evaluated)."""

    def submit(current: mx.array) -> mx.array:
        following = step(current)
        mx.async_eval(following)
        return following

    previous = tokens
    for _ in range(3):
        previous = submit(previous)
    mx.eval(previous)
    start = time.perf_counter()
    for _ in range(steps):
        current = submit(previous)
        mx.eval(previous)  # the engine collects step n after launching step n + 1
        previous = current
    mx.eval(previous)
    return 1000 * (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--model", default="qwen3-4b", choices=sorted(SYNTHETIC_CONFIGS))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--tiny-ops",
        type=int,
        default=800,
        help="one-element additions in the per-operation probe (about the "
        "operation count of a Qwen3-4B step)",
    )
    parser.add_argument(
        "--kernel-trace", action="store_true", help="per-kernel GPU time (needs torch)"
    )
    parser.add_argument(
        "--step-only",
        action="store_true",
        help="time the whole step only (no products, attention or per-op probes)",
    )
    parser.add_argument(
        "--attention-splits",
        type=int,
        nargs="*",
        default=[],
        help="also time the attention chain and the compiled step with the decode attention "
        "split into each of these key chunk counts (CUDA build; 0 = the planner's choice)",
    )
    parser.add_argument("--json-output", type=Path)
    args = parser.parse_args(argv)
    if args.step_only and (args.attention_splits or args.kernel_trace or args.json_output):
        parser.error(
            "--step-only prints the step's times only: drop --attention-splits, "
            "--kernel-trace and --json-output, or --step-only"
        )
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    dtype = DTYPES[args.dtype]

    backend = get_backend("native")
    model, _ = build_synthetic(args.model, backend=backend, dtype=dtype)
    cfg = model.args
    B, ctx, ps = args.batch, args.context, args.page_size
    pages_per_row = -(-ctx // ps)
    pool = PagePool(ps, B * pages_per_row + 1)
    kv = model.make_kv_storage(pool)
    rows = [pool.allocate(pages_per_row) for _ in range(B)]
    block_table = [list(r) for r in rows]
    metadata = BatchMetadata.from_host(
        block_table, [ctx] * B, query_len=1, page_size=ps, num_pages=pool.capacity
    )
    for layer in range(cfg.num_hidden_layers):
        kv.update_layer(
            layer,
            mx.random.normal(kv.keys[layer].shape).astype(dtype),
            mx.random.normal(kv.values[layer].shape).astype(dtype),
        )
    mx.eval(kv.keys, kv.values)
    tokens = mx.random.randint(0, cfg.vocab_size, (B, 1)).astype(mx.int32)

    def step() -> list[mx.array]:
        return [model.step(tokens, metadata, kv), *kv.keys, *kv.values]

    weights = _linear_weights(model)
    weight_bytes = sum(w.nbytes for w in weights)
    inputs = {
        (rows_, w.shape[1]): mx.random.normal((rows_, w.shape[1])).astype(dtype)
        for rows_ in (1, B)
        for w in weights
    }
    mx.eval(list(inputs.values()))

    def linears(
        rows_: int, product: Callable[[mx.array, mx.array], mx.array], group: list[mx.array]
    ) -> Callable[[], list[mx.array]]:
        return lambda: [product(inputs[rows_, w.shape[1]], w) for w in group]

    def matmul(x: mx.array, w: mx.array) -> mx.array:
        return x @ w.T

    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = mx.random.normal((B, Hq, 1, D)).astype(dtype)
    new_k = mx.random.normal((B, Hkv, D)).astype(dtype)
    new_v = mx.random.normal((B, Hkv, D)).astype(dtype)
    mx.eval(q, new_k, new_v)

    def attention() -> list[mx.array]:
        outs = []
        for layer in range(cfg.num_hidden_layers):
            k_pages, v_pages = backend.write_kv(
                kv.keys[layer], kv.values[layer], new_k, new_v, metadata.slot_mapping
            )
            outs.append(
                backend.paged_attention(
                    q,
                    k_pages,
                    v_pages,
                    metadata.block_table,
                    metadata.context_lens,
                    ps,
                    scale=D**-0.5,
                    mask="causal",
                )
            )
        return outs

    one = mx.ones((1,), dtype=dtype)
    mx.eval(one)
    ops_per_step = args.tiny_ops

    def tiny_views() -> list[mx.array]:
        x = mx.ones((2, 3), dtype=dtype) + one  # one kernel, then reshapes only
        for i in range(ops_per_step):
            x = x.reshape((3, 2) if i % 2 == 0 else (2, 3))
        return [x]

    def tiny_ops() -> list[mx.array]:
        x = one
        for _ in range(ops_per_step):
            x = x + one
        return [x]

    results: dict[str, float] = {}
    results["step"] = _median_ms(step, args.steps)
    model.compile_decode = True
    # One measurement gives both: the wall time of the compiled step and its host share.
    host_ms, results["step+compile"] = _host_and_wall_ms(step, args.steps)
    results["step+compile host"] = host_ms

    def next_tokens(current: mx.array) -> mx.array:
        # The K/V writes are outputs of the layers the logits need: evaluated with them.
        logits = model.step(current, metadata, kv)
        return mx.argmax(logits, axis=-1).astype(mx.int32).reshape(B, 1)

    results["step+compile overlapped"] = _overlapped_ms(next_tokens, tokens, args.steps)
    model.compile_decode = False
    if args.step_only:
        times = ", ".join(f"{name} {ms:.3f} ms" for name, ms in results.items())
        print(f"{args.model} {args.dtype} B={B} ctx={ctx}: {times}")
        return 0
    products = {
        f"M={B} backend": (B, backend.linear),
        f"M={B} matmul": (B, matmul),
        "M=1 matmul": (1, matmul),
    }

    def time_products(group: list[mx.array], label: str) -> float:
        rows_, product = products[label]
        return _median_ms(linears(rows_, product, group), args.steps)

    for label in products:
        results[f"linears {label}"] = time_products(weights, label)
    by_shape: dict[str, dict[str, dict[str, float]]] = {}
    for shape in sorted({tuple(w.shape) for w in weights}):
        group = [w for w in weights if tuple(w.shape) == shape]
        per_call = {}
        for label in products:
            us = 1000 * time_products(group, label) / len(group)
            per_call[label] = {"us": us, "GB/s": group[0].nbytes / us / 1e3}
        by_shape[f"{shape[0]}x{shape[1]} x{len(group)}"] = per_call
    results["attention"] = _median_ms(attention, args.steps)
    split_sweep = _split_sweep(
        args.attention_splits, attention, step, model, args.steps, args.kernel_trace
    )
    results[f"tiny ops x{ops_per_step}"] = _median_ms(tiny_ops, args.steps)
    results[f"tiny views x{ops_per_step}"] = _median_ms(tiny_views, args.steps)
    primitives = _primitive_counts(step())

    trace = None
    if args.kernel_trace:
        model.compile_decode = True
        trace = _kernel_trace(step, args.steps)
        model.compile_decode = False

    floor_ms = weight_bytes / 4.3e12 * 1e3
    print(
        f"{args.model} {args.dtype} B={B} ctx={ctx} ps={ps}: {len(weights)} linears, "
        f"{weight_bytes / 1e9:.2f} GB (floor {floor_ms:.2f} ms at 4.3 TB/s)"
    )
    for name, ms in results.items():
        print(f"  {name:<22} {ms:8.3f} ms")
    for splits, ms in split_sweep.items():
        cells = ", ".join(f"{name} {value:.3f} ms" for name, value in ms.items())
        print(f"  attention split into {splits} (0 = planner): {cells}")
    print("  per weight shape [N x K x count]: us per product (GB/s of weights)")
    for shape, per_call in by_shape.items():
        cells = "  ".join(f"{k}: {v['us']:6.1f} ({v['GB/s']:4.0f})" for k, v in per_call.items())
        print(f"  {shape:<16} {cells}")
    print(f"  primitives per step: {sum(primitives.values())} " + str(primitives))
    if trace is not None:
        print(
            f"  compiled step: {trace['kernels_per_step']:.0f} kernels, "
            f"{trace['kernel_us_per_step'] / 1000:.3f} ms of GPU time per step; top 15:"
        )
        timeline = ", ".join(
            f"{k} {v / 1000:.3f} ms" if v is not None else f"{k} (no traced step)"
            for k, v in trace["step_timeline_us"].items()
        )
        print(f"  step timeline (medians): {timeline}")
        for k in trace["kernels"][:15]:
            print(f"    {k['us']:8.1f} us  {k['calls']:5.0f} calls  {k['kernel'][:90]}")
        cells = [
            f"{tuple(launch['grid'])}: {launch['us'] / launch['calls']:.1f}"
            for launch in trace["launches"]
            if "linear_kernel" in launch["kernel"]
        ]
        print("  linear launches (grid: us per call) " + "  ".join(cells))
    if args.json_output:
        args.json_output.parent.mkdir(parents=True, exist_ok=True)
        args.json_output.write_text(
            json.dumps(
                {
                    "kind": "decode_step",
                    "provenance": collect_provenance(args.device),
                    "shape": {
                        "model": args.model,
                        "dtype": args.dtype,
                        "batch": B,
                        "context": ctx,
                        "page_size": ps,
                        "steps": args.steps,
                    },
                    "weight_bytes": weight_bytes,
                    "weight_floor_ms": floor_ms,
                    "median_ms": results,
                    "linear_by_shape": by_shape,
                    "primitives": primitives,
                    "attention_split_sweep": split_sweep,
                    "kernel_trace": trace,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
