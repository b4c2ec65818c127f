"""The measured process of the attention benchmark: one path over a list of cells.

`attention.py` starts one fresh process per (repeat, path); it builds every cell's inputs, runs
the correctness gate against `pagekernels`' readable reference, then times the cell and prints
one JSON line per cell to stdout (so a crash loses only the cell it happened in).
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import mlx.core as mx
from attention_workload import (
    PagedInputs,
    Shape,
    attention_call,
    bytes_moved,
    check_gate,
    derive_copy,
    make_paged_inputs,
    sdpa_inputs,
)
from batch_timer import BatchPlan, plan_batches, time_batches
from write_workload import functional_write_kv, make_write_inputs, write_call

__all__ = ["WorkerConfig", "run_worker"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """What one measured process does (sent by the parent as JSON)."""

    path: str
    cells: tuple[Shape, ...]
    device: str
    backend: str
    reference: str
    seed: int
    warmup: int
    iterations: int
    max_calls: int
    memory_budget: int
    cache_bytes: int
    reuse_factor: int
    decode_splits: int = 0  # CUDA decode key chunks (0 = the planner's choice)
    prefill_kernel: str = "auto"  # CUDA kernel of 128-row prefill tiles (tuning.h)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "cells": [c.to_dict() for c in self.cells]})

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        fields = json.loads(text)
        return cls(**{**fields, "cells": tuple(Shape(**c) for c in fields["cells"])})


def _pool_bytes(x: PagedInputs) -> int:
    return x.key_pages.nbytes + x.value_pages.nbytes


def _timed(
    label: str,
    call: Callable[[int], object],
    plan: BatchPlan,
    cfg: WorkerConfig,
    moved: dict[str, int],
    **extra: object,
) -> dict[str, object]:
    samples = time_batches(call, plan=plan, warmup=cfg.warmup, iterations=cfg.iterations)
    return {
        "path": label,
        "status": "ok",
        "bytes": moved,
        "copies": plan.copies,
        "calls_per_batch": plan.calls_per_batch,
        "samples_us": [s * 1e6 for s in samples],
        "median_us": statistics.median(samples) * 1e6,
        **extra,
    }


def _plan(cfg: WorkerConfig, copy_bytes: int, transient_bytes: int) -> BatchPlan:
    return plan_batches(
        copy_bytes=copy_bytes,
        transient_bytes=transient_bytes,
        cache_bytes=cfg.cache_bytes,
        memory_budget=cfg.memory_budget,
        max_calls=cfg.max_calls,
        reuse_factor=cfg.reuse_factor,
    )


def _attention_cell(shape: Shape, cfg: WorkerConfig, backend, reference) -> list[dict]:
    """Gate, then time `cfg.path` (the dense worker also times its gather alone)."""
    first = make_paged_inputs(shape, seed=cfg.seed)
    expected = attention_call("paged", reference, shape)(first)
    transient = shape.gather_bytes - shape.kv_bytes if cfg.path == "dense" else shape.qo_bytes
    pool_bytes = _pool_bytes(first)
    plan = _plan(cfg, shape.kv_bytes if cfg.path == "sdpa" else pool_bytes, transient)

    def prepare(x: PagedInputs) -> object:
        # The library baseline's input must not depend on our gather: use the reference's.
        return sdpa_inputs(reference, x, shape) if cfg.path == "sdpa" else x

    copies = [prepare(first)]
    call = attention_call(cfg.path, backend, shape)
    gates = {cfg.path: check_gate(call(copies[0]), expected, shape.dtype)}
    if cfg.path == "dense":
        ours = attention_call("gather", backend, shape)(first)
        theirs = attention_call("gather", reference, shape)(first)
        checks = [check_gate(a, b, shape.dtype) for a, b in zip(ours, theirs, strict=True)]
        gates["gather"] = {
            "ok": all(c["ok"] for c in checks),
            "keys": checks[0],
            "values": checks[1],
        }
    del expected
    if not all(g["ok"] for g in gates.values()):
        return [{"path": p, "status": "gate_failed", "gate": g} for p, g in gates.items()]
    copies += [prepare(derive_copy(first, i)) for i in range(1, plan.copies)]
    del first  # the sdpa path keeps only gathered copies

    def timed(label: str, run: Callable, gate: dict) -> dict:
        moved = bytes_moved(label, shape, pool_bytes=pool_bytes)
        return _timed(label, lambda i: run(copies[i % plan.copies]), plan, cfg, moved, gate=gate)

    results = [timed(cfg.path, call, gates[cfg.path])]
    if cfg.path == "dense":
        results.append(timed("gather", attention_call("gather", backend, shape), gates["gather"]))
    return results


def _write_cell(shape: Shape, cfg: WorkerConfig, backend, reference) -> list[dict]:
    """Gate `write_kv` against the reference bit for bit, then time it and the naive copy."""
    first = make_paged_inputs(shape, seed=cfg.seed)
    rows = make_write_inputs(shape, first, seed=cfg.seed)
    args = (rows.keys, rows.values, rows.slot_mapping)
    ours = backend.write_kv(first.key_pages + 0, first.value_pages + 0, *args)
    theirs = reference.write_kv(first.key_pages + 0, first.value_pages + 0, *args)
    exact = all(
        bool(mx.array_equal(a, b, equal_nan=True).item()) for a, b in zip(ours, theirs, strict=True)
    )
    gate = {"ok": exact, "rule": "bit-identical to the reference write_kv"}
    del ours, theirs
    if not exact:
        return [{"path": "write", "status": "gate_failed", "gate": gate}]
    plan = _plan(cfg, _pool_bytes(first), shape.write_bytes)
    pools = [(first.key_pages, first.value_pages)]
    pools += [
        (x.key_pages, x.value_pages) for x in (derive_copy(first, i) for i in range(1, plan.copies))
    ]
    write = write_call(backend, rows)

    def step(i: int) -> tuple[mx.array, mx.array]:
        pools[i % plan.copies] = write(*pools[i % plan.copies])
        return pools[i % plan.copies]

    pool_bytes = _pool_bytes(first)
    naive_plan = _plan(cfg, pool_bytes, pool_bytes)
    return [
        _timed(
            "write", step, plan, cfg, bytes_moved("write", shape, pool_bytes=pool_bytes), gate=gate
        ),
        _timed(
            "write_functional",
            lambda i: functional_write_kv(*pools[i % plan.copies], *args),
            BatchPlan(copies=plan.copies, calls_per_batch=naive_plan.calls_per_batch),
            cfg,
            bytes_moved("write_functional", shape, pool_bytes=pool_bytes),
        ),
    ]


def run_worker(cfg: WorkerConfig) -> int:
    """Runs every cell of `cfg`, printing one JSON line per (cell, timed path) to stdout."""
    from pagekernels import get_backend

    mx.set_default_device(mx.gpu if cfg.device == "gpu" else mx.cpu)
    backend, reference = get_backend(cfg.backend), get_backend(cfg.reference)
    if cfg.decode_splits or cfg.prefill_kernel != "auto":
        from pagekernels import _ext, with_cuda

        if not with_cuda:
            raise SystemExit(
                "--decode-splits and --prefill-kernel need pagekernels built with "
                "PAGEKERNELS_CUDA=1"
            )
        _ext.set_decode_num_splits(cfg.decode_splits)
        _ext.set_prefill_kernel(cfg.prefill_kernel)
    cell_runner = _write_cell if cfg.path == "write" else _attention_cell
    for shape in cfg.cells:
        start = time.perf_counter()
        try:
            results = cell_runner(shape, cfg, backend, reference)
        except Exception as exc:  # one broken cell must not hide the others' results
            traceback.print_exc()
            results = [{"path": cfg.path, "status": "error", "error": repr(exc)}]
        seconds = time.perf_counter() - start
        for result in results:
            line = {"shape": shape.to_dict(), "seed": cfg.seed, "cell_seconds": seconds, **result}
            print(json.dumps(line), flush=True)
        mx.clear_cache()
    return 0
