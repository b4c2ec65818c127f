"""The GPU's SM clock and power draw while one attention path runs back to back (GPU).

Two kernels a few percent apart can be told apart by the clock as much as by their code: under a
sustained tensor-core load a GPU lowers its SM clock to stay within its power limit. This script
runs each path (direct paged attention; MLX SDPA on the gathered K/V) on one shape for
`--seconds`, keeping the GPU busy (the next batch of calls is submitted before the previous one
is waited for), while `nvidia-smi` samples the SM clock, the power draw and the active
clock-event reasons. Per path it reports us per call, the median clock and power over the
samples after the load's first `--settle-s`, energy per call, and every clock-event reason seen
(bitmask, as nvidia-smi prints it). With `--trace`, the load's last half second runs under
CUPTI: each kernel's duration under the power cap (against its duration alone, as ncu or
kernel_time.py report it), and how the kernels sat on the GPU: the span from the first start
to the last end, the time no kernel ran, and how many ran at once. Paths
alternate over `--rounds` rounds. Every call reads the same inputs: right for prefill (its K/V
are read from L2 either way), but decode shapes would run from L2 here.

    python benchmarks/sustained_load.py --shape 1x4096x16x4096 --json-output sustained.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
from attention_workload import Shape, attention_call, check_gate, make_paged_inputs, sdpa_inputs
from cupti_trace import kernel_events, trace_events

from pagekernels import get_backend
from qwen3model.provenance import collect_provenance

PATHS = ("paged", "sdpa")
QUERY = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu")
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new, old name
PERIOD_MS = 50  # nvidia-smi's sampling period
TRACE_S = 0.5  # the load's traced end
IDLE_S = 0.2  # between starting nvidia-smi and the load
TIMESTAMP = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's timestamp field


def _reasons_field() -> str:
    """The clock-event reasons field this driver's nvidia-smi knows."""
    for field in REASONS:
        probe = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            return field
    raise SystemExit(f"nvidia-smi knows none of {REASONS}")


def _sample_gpu(field: str, period_ms: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "nvidia-smi",
            "--id=0",
            f"--query-gpu={','.join(QUERY)},{field}",
            "--format=csv,noheader,nounits",
            f"-lms={period_ms}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def timeline(kernels: list[dict]) -> dict:
    """How traced kernels (`ts`, `dur` in us) sat on the GPU: durations per kernel name, the
    span from the first start to the last end, the time covered by at least one kernel (busy),
    and the most that ran at once (a kernel starting as another ends does not overlap it)."""
    if not kernels:
        raise ValueError("the trace holds no kernel: is CUPTI seeing MLX's launches?")
    by_name: dict[str, list[float]] = {}
    for k in kernels:
        by_name.setdefault(k["name"], []).append(k["dur"])
    edges = sorted([(k["ts"], 1) for k in kernels] + [(k["ts"] + k["dur"], -1) for k in kernels])
    running = most = 0
    busy = 0.0
    previous = edges[0][0]
    for time_us, step in edges:  # ends sort before starts at the same time
        if running > 0:
            busy += time_us - previous
        running += step
        most = max(most, running)
        previous = time_us
    span = max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)
    return {
        "kernels": {
            name: {
                "count": len(durations),
                "median_us": statistics.median(durations),
                "range_us": [min(durations), max(durations)],
            }
            for name, durations in by_name.items()
        },
        "span_us": span,
        "busy_us": busy,
        "idle_us": span - busy,
        "max_concurrent": most,
    }


def trace_summary(traced: dict) -> str:
    """One line per kernel name (count, median and range of durations), then the timeline."""
    if "error" in traced:
        return f"  trace: {traced['error']}"
    lines = [
        f"  {k['count']:3d} x {k['median_us']:8.1f} us ({k['range_us'][0]:.1f}-"
        f"{k['range_us'][1]:.1f})  {name[:90]}"
        for name, k in traced["kernels"].items()
    ]
    lines.append(
        f"  {traced['calls']} calls: span {traced['span_us']:.1f} us "
        f"({traced['span_us'] / traced['calls']:.1f} per call), idle {traced['idle_us']:.1f} us, "
        f"at most {traced['max_concurrent']} kernels at once"
    )
    return "\n".join(lines)


def run_path(
    call, inputs, *, calls: int, seconds: float, settle_s: float, field: str, trace: bool = False
) -> dict:
    """`calls` lazy calls per batch, batches back to back for `seconds`, sampled by nvidia-smi.
    With `trace`, the load's last TRACE_S (at most half of it) runs under the profiler, which
    was started once beforehand so that starting it again leaves the GPU no time to idle; the
    time per call then comes from the untraced part."""
    mx.eval([call(inputs) for _ in range(calls)])  # warm-up
    if trace:
        trace_events(lambda: None)  # imports PyTorch and starts CUPTI once, before the load
    sampler = _sample_gpu(field, period_ms=PERIOD_MS)
    time.sleep(IDLE_S)  # nvidia-smi's first sample
    settled = datetime.datetime.now() + datetime.timedelta(seconds=settle_s)
    start = time.perf_counter()
    done = 0
    pending = [call(inputs) for _ in range(calls)]
    mx.async_eval(pending)

    def load(until_s: float) -> None:  # the next batch is submitted before this one is waited for
        nonlocal done, pending
        while time.perf_counter() - start < until_s:
            following = [call(inputs) for _ in range(calls)]
            mx.async_eval(following)
            mx.eval(pending)
            done += calls
            pending = following

    traced_s = min(TRACE_S, seconds / 2) if trace else 0.0
    load(seconds - traced_s)
    timed = (done, time.perf_counter() - start)
    traced = None
    if trace:
        launched = kernel_events(trace_events(lambda: load(seconds)))
        try:
            traced = {"calls": done - timed[0], "seconds": traced_s, **timeline(launched)}
        except ValueError as error:  # keep the finished runs
            traced = {"error": str(error)}
    mx.eval(pending)
    done += calls
    wall = time.perf_counter() - start
    ended = datetime.datetime.now()
    sampler.terminate()
    lines = sampler.communicate()[0].strip().splitlines()
    rows = [[cell.strip() for cell in line.split(",")] for line in lines]
    steady = [r for r in rows if settled <= datetime.datetime.strptime(r[0], TIMESTAMP) <= ended]
    if not steady:
        raise SystemExit(
            f"no nvidia-smi sample between {settle_s} s into the load and its end "
            f"({len(rows)} in all): run longer than --settle-s"
        )
    clocks = [float(r[1]) for r in steady]
    power = [float(r[2]) for r in steady]
    calls_timed, seconds_timed = timed if trace else (done, wall)
    us_per_call = seconds_timed / calls_timed * 1e6
    return {
        "calls": done,
        "seconds": wall,
        "us_per_call": us_per_call,
        "sm_clock_mhz_median": statistics.median(clocks),
        "sm_clock_mhz_range": [min(clocks), max(clocks)],
        "power_w_median": statistics.median(power),
        "energy_mj_per_call": statistics.median(power) * us_per_call * 1e-3,
        "temperature_c_max": max(float(r[3]) for r in steady),
        "clock_event_reasons": sorted({r[4] for r in steady}),
        "steady_samples": len(steady),
        "samples": rows,
        "trace": traced,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape", default="1x4096x16x4096", help="BxCONTEXTxPAGE_SIZExQUERY_LEN, as ncu_cases.py"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per path and round")
    parser.add_argument("--settle-s", type=float, default=0.5, help="samples dropped per run")
    parser.add_argument("--calls", type=int, default=16, help="calls per submitted batch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--trace", action="store_true", help="trace a batch after each run (needs PyTorch)"
    )
    parser.add_argument("--json-output", type=Path)
    args = parser.parse_args(argv)
    if not mx.cuda.is_available():
        raise SystemExit("needs MLX's CUDA backend and nvidia-smi")
    mx.set_default_device(mx.gpu)
    batch, context, page_size, query_len = (int(x) for x in args.shape.split("x"))
    shape = Shape(batch=batch, context=context, page_size=page_size, query_len=query_len)
    backend, reference = get_backend("native"), get_backend("reference")
    paged_inputs = make_paged_inputs(shape, seed=1)
    expected = attention_call("paged", reference, shape)(paged_inputs)
    inputs = {"paged": paged_inputs, "sdpa": sdpa_inputs(reference, paged_inputs, shape)}
    calls = {path: attention_call(path, backend, shape) for path in PATHS}
    gates = {path: check_gate(calls[path](inputs[path]), expected, shape.dtype) for path in PATHS}
    if not all(g["ok"] for g in gates.values()):
        raise SystemExit(f"gate failed: {gates}")
    field = _reasons_field()
    runs: dict[str, list[dict]] = {path: [] for path in PATHS}
    for round_ in range(args.rounds):
        for path in PATHS if round_ % 2 == 0 else PATHS[::-1]:
            run = run_path(
                calls[path],
                inputs[path],
                calls=args.calls,
                seconds=args.seconds,
                settle_s=args.settle_s,
                field=field,
                trace=args.trace,
            )
            runs[path].append(run)
            print(
                f"{shape.label()} {path:5s} round {round_}: {run['us_per_call']:7.1f} us/call, "
                f"SM {run['sm_clock_mhz_median']:.0f} MHz, {run['power_w_median']:.0f} W, "
                f"{run['energy_mj_per_call']:.3f} mJ/call, reasons {run['clock_event_reasons']}",
                flush=True,
            )
            if run["trace"] is not None:
                print(trace_summary(run["trace"]), flush=True)
    if args.json_output:
        record = {
            "kind": "sustained_load",
            "provenance": collect_provenance("gpu"),
            "method": __doc__.split("\n\n")[1],
            "shape": shape.to_dict(),
            "reasons_field": field,
            "gates": gates,
            "runs": runs,
        }
        args.json_output.parent.mkdir(parents=True, exist_ok=True)
        args.json_output.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
