"""Tests of the benchmark tools themselves: floors, batch planning, the gate, aggregation, the
attention CLI end to end on a tiny grid, the admission sweep, the plots, the A/B table, the ncu
listing reader, the metadata placements, and the GPU-only tools' bookkeeping (kernel time, sustained
load) with their GPU-side sources (CUPTI, nvidia-smi) replaced."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import ab_table
import admission_sweep
import attention
import attention_worker
import decode_step
import kernel_time
import metadata_placement
import mlx.core as mx
import ncu_sass
import numpy as np
import plot
import pytest
import structlog
import sustained_load
from admission_sweep import dense_slots, token_bytes
from attention_report import aggregate
from attention_workload import Shape, attention_call, check_gate, make_paged_inputs
from batch_timer import plan_batches

from pagekernels import get_backend
from qwen3model import load_model
from qwen3model.serving import Trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _small_shape(batch: int) -> Shape:
    """Context 40 over pages of 16: the last page of every row has 8 unused slots."""
    return Shape(batch=batch, context=40, page_size=16, heads_q=4, heads_kv=2, head_dim=64)


def test_shape_floors_match_the_design_notes() -> None:
    for batch, context in [(1, 128), (8, 1024), (32, 32768)]:
        shape = Shape(batch=batch, context=context, page_size=16)
        assert shape.kv_bytes == 4096 * batch * context  # design notes §0, bf16
        assert shape.gather_bytes == 2 * shape.kv_bytes  # pages read + dense copy written
    for length in (128, 1024, 4096):
        prefill = Shape(batch=1, context=length, page_size=16, query_len=length)
        assert prefill.flops == 8192 * length * (length + 1)  # causal: L(L+1)/2 visible pairs
    assert Shape(batch=3, context=100, page_size=16).gather_bytes == 4096 * 3 * (100 + 112)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"batch": 0}, "batch=0"),
        ({"heads_q": 12, "heads_kv": 8}, "not a multiple"),
        ({"query_len": 9, "context": 8}, "exceeds context"),
        ({"dtype": "int8"}, "dtype='int8'"),
    ],
    ids=["empty-batch", "gqa-ratio", "query-past-context", "dtype"],
)
def test_shape_rejects_bad_fields(fields: dict, message: str) -> None:
    base = {"batch": 1, "context": 64, "page_size": 16}
    with pytest.raises(ValueError, match=message):
        Shape(**{**base, **fields})


def test_plan_rotates_past_the_cache_within_the_budget() -> None:
    plan = plan_batches(
        copy_bytes=10**6,
        transient_bytes=10**5,
        cache_bytes=50 * 10**6,
        memory_budget=10**9,
        max_calls=50,
    )
    assert plan.copies * 10**6 >= 4 * 50 * 10**6 and plan.calls_per_batch == 50
    capped = plan_batches(
        copy_bytes=10**6,
        transient_bytes=10**8,
        cache_bytes=50 * 10**6,
        memory_budget=5 * 10**8,
        max_calls=50,
    )
    assert capped.copies == 200 and capped.calls_per_batch == 3  # (500 - 200) MB / 100 MB
    huge = plan_batches(
        copy_bytes=10**10,
        transient_bytes=10**10,
        cache_bytes=50 * 10**6,
        memory_budget=10**9,
        max_calls=50,
    )
    assert (huge.copies, huge.calls_per_batch) == (1, 1)


def test_gate_rejects_wrong_and_nan_outputs(on_cpu) -> None:
    shape = _small_shape(batch=2)
    inputs = make_paged_inputs(shape, seed=3)
    expected = attention_call("paged", get_backend("reference"), shape)(inputs)
    assert check_gate(expected, expected, shape.dtype)["ok"]
    assert not check_gate(expected * 1.1, expected, shape.dtype)["ok"]
    poisoned = mx.where(mx.arange(64) == 5, mx.array(float("nan")), expected.astype(mx.float32))
    assert not check_gate(poisoned, expected, shape.dtype)["ok"]


def test_inputs_shuffle_pages_and_poison_every_slot_no_row_reads(on_cpu) -> None:
    shape = _small_shape(batch=3)
    inputs = make_paged_inputs(shape, seed=5)
    table = inputs.block_table.tolist()
    flat = [page for row in table for page in row]
    assert len(set(flat)) == len(flat) and flat != sorted(flat)
    finite = mx.isnan(inputs.key_pages).sum(axis=(1, 3)) == 0  # [P, ps]
    expected = [[False] * 16 for _ in range(inputs.key_pages.shape[0])]
    for row in table:
        for i, page in enumerate(row):
            expected[page] = [i * 16 + slot < 40 for slot in range(16)]
    assert finite.tolist() == expected
    assert mx.array_equal(mx.isnan(inputs.key_pages), mx.isnan(inputs.value_pages)).item()


@pytest.mark.parametrize("variant", metadata_placement.VARIANTS)
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_every_metadata_placement_gives_the_same_values(variant: str, batch: int, on_cpu) -> None:
    table = np.random.default_rng(batch).permutation(batch * 3).reshape(batch, 3).astype(np.int32)
    lens = [40 + b for b in range(batch)]
    make = metadata_placement.metadata_factory(variant, table, lens)
    for _ in range(2):  # per-call variants make fresh arrays each time
        block_table, context_lens = make()
        assert block_table.shape == (batch, 3) and block_table.dtype == mx.int32
        assert block_table.tolist() == table.tolist()
        assert context_lens.tolist() == lens


def test_aggregate_takes_the_median_of_process_medians() -> None:
    shape = Shape(batch=1, context=128, page_size=16).to_dict()
    records = [
        {
            "path": "paged",
            "shape": shape,
            "status": "ok",
            "median_us": us,
            "samples_us": [us],
            "bytes": {"kv_bytes": 524288},
            "repeat": i,
        }
        for i, us in enumerate([30.0, 10.0, 20.0])
    ]
    (cell,) = aggregate(records)
    assert cell["median_us"] == 20.0 and cell["spread_us"] == [10.0, 30.0]
    assert cell["kv_gbps"] == pytest.approx(524288 / 20e-6 / 1e9)
    assert len(cell["processes"]) == 3


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["ok", "gate_failed", "ok"], "gate_failed"),
        (["error", "ok"], "error"),
        (["error", "gate_failed"], "gate_failed"),
        (["ok", "ok"], "ok"),
    ],
)
def test_a_cell_is_ok_only_when_every_process_is(statuses: list[str], expected: str) -> None:
    """Repeats run other seeds: one failed correctness gate fails the cell."""
    shape = Shape(batch=1, context=128, page_size=16).to_dict()
    records = [
        {"path": "paged", "shape": shape, "status": status, "median_us": 10.0, "repeat": i}
        for i, status in enumerate(statuses)
    ]
    (cell,) = aggregate(records)
    assert cell["status"] == expected
    assert ("median_us" in cell) == (expected == "ok")  # no figure printed for a failed cell


def test_attention_cli_end_to_end(tmp_path: Path, capsys) -> None:
    output = tmp_path / "attention.json"
    status = attention.main(
        [
            "--device",
            "cpu",
            "--batches",
            "2",
            "--contexts",
            "48",
            "--page-sizes",
            "16",
            "--prefill",
            "32",
            "--heads-q",
            "4",
            "--heads-kv",
            "2",
            "--head-dim",
            "64",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--iterations",
            "2",
            "--write-context",
            "48",
            "--cache-mb",
            "1",
            "--json-output",
            str(output),
        ]
    )
    assert status == 0, capsys.readouterr().err
    document = json.loads(output.read_text())
    assert document["complete"] and document["provenance"]["mlx_version"] == mx.__version__
    assert document["provenance"]["command"]
    orders = [[p["path"] for p in document["processes"] if p["repeat"] == r] for r in (0, 1)]
    assert orders[1] == orders[0][::-1] == ["write", "sdpa", "paged", "dense"]
    by_path: dict[str, int] = {}
    for cell in document["cells"]:
        assert cell["status"] == "ok", cell
        assert len(cell["processes"]) == 2 and all(
            len(p["samples_us"]) == 2 for p in cell["processes"]
        )
        assert cell["median_us"] == statistics.median(p["median_us"] for p in cell["processes"])
        by_path[cell["path"]] = by_path.get(cell["path"], 0) + 1
    assert by_path == {
        "dense": 2,
        "gather": 2,
        "paged": 2,
        "sdpa": 2,
        "write": 1,
        "write_functional": 1,
    }
    pngs = plot.plot_files([output], tmp_path / "plots")
    assert {p.name for p in pngs} == {
        "attention-decode-latency.png",
        "attention-decode-bandwidth.png",
        "attention-prefill.png",
        "attention-write-kv.png",
    }
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs)


@pytest.fixture
def keep_structlog_config():
    """admission_sweep.main configures structlog (as a command does); undo it afterwards."""
    config = structlog.get_config()
    yield
    structlog.configure(**config)


def test_admission_sweep_and_serving_plots(tmp_path: Path, on_cpu, keep_structlog_config) -> None:
    output = tmp_path / "admission.json"
    status = admission_sweep.main(
        [
            "--device",
            "cpu",
            "--model",
            "synthetic:qwen3-tiny",
            "--num-seqs",
            "4",
            "--min-input-len",
            "16",
            "--max-input-len",
            "40",
            "--min-output-len",
            "2",
            "--max-output-len",
            "6",
            "--budgets",
            "1",
            "2",
            "--json-output",
            str(output),
        ]
    )
    assert status == 0
    document = json.loads(output.read_text())
    rows = document["rows"]
    assert [(r["variant"], r["policy"]) for r in rows[:3]] == [
        ("paged", "reserve"),
        ("paged", "optimistic"),
        ("dense", "reserve-max-length"),
    ]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    model, _ = load_model("synthetic:qwen3-tiny", kernel_backend="reference")
    trace = Trace(**document["trace"])
    for row in rows:
        result = row["result"]
        assert result["num_requests"] == 4
        assert 1 <= result["mean_decode_rows"] <= result["peak_decode_rows"]
        assert result["peak_decode_rows"] <= row["max_batch_size"]
        if row["variant"] == "dense":
            assert row["max_batch_size"] == dense_slots(row["budget_bytes"], trace, model)
    assert document["model"]["kv_bytes_per_token"] == token_bytes(model)
    serving = tmp_path / "serving.json"
    serving.write_text(
        json.dumps(
            {
                "trace": document["trace"],
                "context": {"model": "tiny"},
                "results": [rows[0]["result"]],
            }
        )
    )
    pngs = plot.plot_files([output, serving], tmp_path / "plots")
    assert [p.name for p in pngs] == ["admission-admission.png", "serving-serving.png"]
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in pngs)


def test_plots_read_sweeps_written_before_concurrency_moved_into_results(tmp_path: Path) -> None:
    committed = Path(__file__).parent / "results" / "cpu-dev" / "admission.json"
    assert json.loads(committed.read_text())["schema"] == "paged-serving/admission-sweep/1"
    (png,) = plot.plot_files([committed], tmp_path)
    assert png.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("path", ["paged", "dense"])
def test_a_wrong_kernel_fails_the_gate_and_is_not_timed(path: str, on_cpu) -> None:
    reference = get_backend("reference")
    off_by_ten_percent = SimpleNamespace(
        paged_attention=lambda *a, **k: reference.paged_attention(*a, **k) * 1.1,
        dense_attention=lambda *a, **k: reference.dense_attention(*a, **k) * 1.1,
        gather_kv=reference.gather_kv,
    )
    cfg = attention_worker.WorkerConfig(
        path=path,
        cells=(),
        device="cpu",
        backend="-",
        reference="reference",
        seed=0,
        warmup=0,
        iterations=1,
        max_calls=1,
        memory_budget=10**8,
        cache_bytes=10**6,
        reuse_factor=1,
    )
    results = attention_worker._attention_cell(_small_shape(2), cfg, off_by_ten_percent, reference)
    assert results[0]["path"] == path and results[0]["status"] == "gate_failed"
    assert not results[0]["gate"]["ok"] and "samples_us" not in results[0]


@pytest.mark.parametrize(
    "flags",
    [["--json-output", "out.json"], ["--kernel-trace"], ["--attention-splits", "2"]],
    ids=["json", "kernel-trace", "splits"],
)
def test_decode_step_rejects_what_step_only_would_ignore(capsys, flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        decode_step.main(["--device", "cpu", "--step-only", *flags])
    assert exit_.value.code == 2
    assert "--step-only prints the step's times only" in capsys.readouterr().err


def test_decode_step_plot_from_the_h200_records(tmp_path: Path) -> None:
    """Committed decode-step results, one from before the host share was measured and one
    after, draw one figure; kernel names map to the families of its GPU-time panel."""
    session = Path(__file__).parent / "results" / "h200" / "session3"
    files = [session / commit / "decode_step.json" for commit in ("bca3df2", "4c02a09")]
    assert plot.detect_kind(json.loads(files[0].read_text())) == "decode_step"
    pngs = plot.plot_files(files, tmp_path / "plots")
    assert [p.name for p in pngs] == ["decode_step-decode-step.png"]
    assert pngs[0].read_bytes().startswith(PNG_MAGIC)
    assert plot._kernel_family("void pagekernels::cuda::linear_kernel<bf16, 1>") == "projections"
    assert plot._kernel_family("mlx::core::cu::rope<bf16>") == "norms + RoPE"
    assert plot._kernel_family("pagekernels::cuda::decode_qkv_kernel<bf16, 128>") == (
        "norms + RoPE + K/V write"
    )
    assert plot._kernel_family("cutlass_80_tensorop_gemm") == "projections"
    assert plot._kernel_family("mlx::core::cu::binary_vv<Add>") == "other"


def test_kernel_time_plot_from_the_h200_records(tmp_path: Path) -> None:
    """Session 16's latency records: one panel per batch, a line per path and page size."""
    record = Path(__file__).parent / "results/h200/session16/planner-70e5991/kernel_time.json"
    document = json.loads(record.read_text())
    assert plot.detect_kind(document) == "kernel_time"
    pngs = plot.plot_files([record], tmp_path / "plots")
    assert [p.name for p in pngs] == ["kernel_time-latency.png"]
    assert pngs[0].read_bytes().startswith(PNG_MAGIC)


def _write_listing(path: Path, rows: list[tuple[str, int, int, int, int]]) -> None:
    """An ncu SASS listing as `ncu --page source --csv` writes it: (sass, samples, executed,
    stall_wait, stall_long_sb) per instruction, numbers with thousands separators."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]  # fmt: skip
    lines = ['"Kernel Name","void k()"', ",".join(f'"{h}"' for h in header)]
    for i, (sass, samples, executed, wait, long_sb) in enumerate(rows):
        fields = [
            f"0x{16 * i:x}",
            sass,
            f"{samples:,}",
            f"{executed:,}",
            str(wait),
            str(long_sb),
            "0",
        ]
        lines.append(",".join(f'"{f}"' for f in fields))
    path.write_text("\n".join(lines) + "\n")


def test_ncu_listing_views_sum_samples_by_range_and_execution_count(tmp_path: Path, capsys) -> None:
    listing = tmp_path / "k-sass.csv"
    _write_listing(
        listing,
        [("LDC R1, c[0x0][0x28]", 3, 528, 3, 0), ("@!P0 BRA 0x10", 1200, 8192, 0, 1200),
         ("MUFU.EX2 R2, R2", 40, 135168, 30, 10), ("FADD R3, R3, R2", 7, 135168, 7, 0)],
    )  # fmt: skip
    instructions = ncu_sass.read_listing(listing)
    assert [ins.samples for ins in instructions] == [3, 1200, 40, 7]
    assert instructions[1].stalls == {"long_sb": 1200}
    assert ncu_sass.parse_range("2-3") == range(2, 4)

    ncu_sass.main(["sum", str(listing), "1", "2-3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1-1: 1200 samples (96.0% of 1250), 8192 warp-instructions")
    assert lines[1].startswith("2-3: 47 samples (3.8% of 1250), 270336 warp-instructions")
    assert lines[1].endswith("wait=37 long_sb=10")

    ncu_sass.main(["count", str(listing)])
    assert capsys.readouterr().out.splitlines()[0].split() == [
        "executed", "8192", "times:", "1200", "samples", "in", "1", "instructions"]  # fmt: skip
    ncu_sass.main(["list", str(listing), "--min-samples", "40"])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["1", "2"]


def test_ncu_listing_reader_rejects_other_csv(tmp_path: Path) -> None:
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an ncu SASS listing"):
        ncu_sass.read_listing(other)
    with pytest.raises(argparse.ArgumentTypeError, match="end before start"):
        ncu_sass.parse_range("5-2")


def test_kernel_time_sums_the_kernels_of_each_call(monkeypatch, on_cpu) -> None:
    traced = []

    def fake_trace(run):  # CUPTI stand-in: 4 calls of three kernels, slower in round 2 of 3
        run()
        traced.append(None)
        slow = 3.0 if 3 < len(traced) <= 6 else 1.0
        kernels = [("attention", 2.0 * slow), ("merge", 1.0), ("attention", 1.0)] * 4
        events = [
            {"cat": "kernel", "name": n, "ts": 4 * i, "dur": d} for i, (n, d) in enumerate(kernels)
        ]
        return events + [{"cat": "cpu_op", "name": "eval", "ts": 0, "dur": 99.0}]

    monkeypatch.setattr(kernel_time, "trace_events", fake_trace)
    results = kernel_time.time_shape(1, 128, [16, 128], calls=4, rounds=3)
    assert [(r["path"], r["shape"]["page_size"]) for r in results] == [
        ("paged", 16), ("paged", 128), ("sdpa", 16)
    ]  # fmt: skip
    assert len(traced) == 3 * 3  # every cell in every round
    for r in results:
        assert r["gate"]["ok"] and r["copies"] > 1
        assert sorted(r["samples_kernel_us"]) == [4.0, 4.0, 8.0]  # one slow trace per cell
        assert r["median_kernel_us"] == 4.0 and r["kernels_per_call"] == 3.0
        assert r["by_kernel_us"] == {"attention": 3.0, "merge": 1.0}  # medians, not a sample
        assert r["median_span_us"] == (4 * 11 + 1.0) / 4  # the last kernel ends at 45 us


@pytest.mark.parametrize("path", kernel_time.PATHS)
def test_kernel_time_chains_calls_through_every_copy(path: str, on_cpu) -> None:
    shape = Shape(batch=1, context=128, page_size=128)
    cell = kernel_time._Cell(path, shape, get_backend("native"), get_backend("reference"))
    copies = len(cell.inputs)
    assert copies >= 4
    seen = []  # (K/V copy, queries) of every call

    def call(x):
        keys = x[1] if path == "sdpa" else x.key_pages
        queries = x[0] if path == "sdpa" else x.queries
        seen.append((id(keys), queries))
        return mx.full(queries.shape, len(seen), queries.dtype)

    cell.call = call
    for _ in range(3):
        last = cell.calls(copies // 2 + 1)
    assert len({k for k, _ in seen[:copies]}) == copies and seen[copies][0] == seen[0][0]
    chained = [int(q[0, 0, 0, 0].item()) for _, q in seen[1 : copies // 2 + 1]]
    assert chained == list(range(1, copies // 2 + 1))  # each call reads the previous output
    assert int(last[0, 0, 0, 0].item()) == len(seen)


def test_sustained_load_reads_nvidia_smi_after_the_settling_samples(
    tmp_path: Path, monkeypatch, on_cpu
) -> None:
    fake = tmp_path / "nvidia-smi"  # 1980 MHz while idle (0.15 s), then 1700 MHz at 600 W
    fake.write_text(
        f"#!{sys.executable}\n"
        "import datetime, sys, time\n"
        "if not any(a.startswith('-lms') for a in sys.argv):\n"
        "    print('0x0'); sys.exit(0)\n"
        "start = time.monotonic()\n"
        "while True:\n"
        "    busy = time.monotonic() - start > 0.15\n"
        "    now = datetime.datetime.now().strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]\n"
        "    row = '1700, 600.0, 61, 0x4' if busy else '1980, 300.0, 40, 0x0'\n"
        "    print(f'{now}, {row}', flush=True)\n"
        "    time.sleep(0.05)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    shape = Shape(batch=1, context=40, page_size=16, query_len=8, heads_q=4, heads_kv=2)
    call = attention_call("paged", get_backend("native"), shape)
    inputs = make_paged_inputs(shape, seed=0)
    field = sustained_load._reasons_field()
    run = sustained_load.run_path(call, inputs, calls=4, seconds=0.8, settle_s=0.1, field=field)
    assert run["calls"] % 4 == 0 and run["calls"] >= 8
    assert run["us_per_call"] == pytest.approx(run["seconds"] / run["calls"] * 1e6)
    assert run["sm_clock_mhz_range"] == [1700.0, 1700.0] and run["power_w_median"] == 600.0
    assert run["clock_event_reasons"] == ["0x4"] and run["temperature_c_max"] == 61.0
    # one sample per 50 ms: the 0.7 s after settling keep most of theirs
    assert run["steady_samples"] >= 8
    with pytest.raises(SystemExit, match="run longer than --settle-s"):
        sustained_load.run_path(call, inputs, calls=4, seconds=0.2, settle_s=5.0, field=field)

    assert run["trace"] is None
    traced_runs = []

    def fake_trace(run):  # CUPTI stand-in: two waves of four 15-us kernels, back to back
        run()
        traced_runs.append(None)
        kernels = [{"cat": "kernel", "name": "attention", "ts": 15.0 * (i // 4), "dur": 15.0}
                   for i in range(8)]  # fmt: skip
        return kernels + [{"cat": "cpu_op", "name": "eval", "ts": 0.0, "dur": 99.0}]

    monkeypatch.setattr(sustained_load, "trace_events", fake_trace)
    run = sustained_load.run_path(
        call, inputs, calls=4, seconds=0.6, settle_s=0.1, field=field, trace=True
    )
    assert len(traced_runs) == 2  # the warm-up trace, then the load's last 0.3 s
    traced = run["trace"]
    assert traced["seconds"] == 0.3 and traced["calls"] > 0 and traced["calls"] % 4 == 0
    assert traced["calls"] < run["calls"]
    assert traced["kernels"] == {
        "attention": {"count": 8, "median_us": 15.0, "range_us": [15.0, 15.0]}
    }
    assert traced["span_us"] == 30.0 and traced["idle_us"] == 0.0
    assert traced["max_concurrent"] == 4
    assert f"{traced['calls']} calls: span 30.0 us" in sustained_load.trace_summary(traced)

    monkeypatch.setattr(sustained_load, "trace_events", lambda run: run() or [])
    run = sustained_load.run_path(
        call, inputs, calls=4, seconds=0.6, settle_s=0.1, field=field, trace=True
    )
    assert "no kernel" in run["trace"]["error"]  # the run itself is kept
    assert run["us_per_call"] > 0 and "no kernel" in sustained_load.trace_summary(run["trace"])


def test_sustained_load_timeline_counts_gaps_and_overlap() -> None:
    kernels = [  # a and b overlap (10-12), then nothing runs 20-25, c alone
        {"name": "a", "ts": 0.0, "dur": 12.0},
        {"name": "b", "ts": 10.0, "dur": 10.0},
        {"name": "c", "ts": 25.0, "dur": 5.0},
        {"name": "a", "ts": 30.0, "dur": 2.0},  # starts as c ends: never two at once
    ]
    line = sustained_load.timeline(kernels)
    assert line["span_us"] == 32.0 and line["busy_us"] == 27.0 and line["idle_us"] == 5.0
    assert line["max_concurrent"] == 2
    assert line["kernels"]["a"] == {"count": 2, "median_us": 7.0, "range_us": [2.0, 12.0]}
    with pytest.raises(ValueError, match="no kernel"):
        sustained_load.timeline([])


def _write_ab_result(folder: Path, variant: str, round_: int, paged: float, sdpa: float) -> None:
    summary = [{"label": "prefill B=1 ctx=4096 ps=16 L=4096 bfloat16", "paged_us": paged,
                "sdpa_us": sdpa}]  # fmt: skip
    document = {"kind": "attention", "summary": summary}
    (folder / f"prefill-{variant}-{round_}.json").write_text(json.dumps(document))


def test_ab_table_pairs_each_variant_with_the_baseline_round_by_round(tmp_path: Path, capsys):
    # gpu-ab.sh's variants.txt order makes `main` the baseline, though `fast` sorts first.
    (tmp_path / "variants.txt").write_text("main 82acbc5\nfast 2c00e55\n")
    rounds = [(100.0, 90.0, 80.0), (110.0, 99.0, 90.0)]  # main, fast, MLX SDPA
    for round_, (main_us, fast_us, sdpa_us) in enumerate(rounds):
        _write_ab_result(tmp_path, "main", round_, main_us, sdpa_us)
        _write_ab_result(tmp_path, "fast", round_, fast_us, sdpa_us)
    assert ab_table.main([str(tmp_path)]) == 0
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[1] for row in rows] == ["main", "fast"]
    main_row, fast_row = rows
    assert main_row[2:] == ["100.0 / 80.0", "110.0 / 90.0", "1.222-1.250", "-", "-"]
    assert fast_row[2:] == ["90.0 / 80.0", "99.0 / 90.0", "1.100-1.125", "-10.0 to -10.0 %",
                            "-10.0 %"]  # fmt: skip

    assert ab_table.main([str(tmp_path), "--baseline", "fast"]) == 0
    fast_first = capsys.readouterr().out
    assert "| main | 100.0 / 80.0 | 110.0 / 90.0 | 1.222-1.250 | +11.1 to +11.1 % | +11.1 % |" in (
        fast_first
    )
    assert ab_table.main([str(tmp_path), "--baseline", "slow"]) == 2
    assert "no variant 'slow'" in capsys.readouterr().err
    (tmp_path / "prefill-main-2.json").write_text(json.dumps({"kind": "kernel_time"}))
    assert ab_table.main([str(tmp_path)]) == 2
    assert "expected 'attention'" in capsys.readouterr().err
