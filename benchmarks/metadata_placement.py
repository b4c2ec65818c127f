"""Where the per-step page metadata lives, and what the attention kernel pays for it (GPU).

MLX's CUDA allocator puts every array from host data in CUDA managed memory, and every array of
at most 8 bytes (`context_lens` at B <= 2, in any case) in a scalar pool of managed memory that
the GPU maps but does not migrate: a kernel reads it over PCIe. This script times
`paged_attention` with its block table and lengths placed in each of these ways:

    pool         lengths made on the GPU once, reused (the scalar pool at B <= 2: <= 8 bytes)
    device       lengths a view of a 16-byte array made on the GPU once, reused
    host         both arrays from host lists for every call (BatchMetadata's way before session 15)
    host-padded  as host, the lengths a view of a host list padded to 4 entries
    host-packed  as host, both arrays views of one host list (one managed buffer per call;
                 BatchMetadata's way now)
    host-copied  as host-packed, the views taken of a GPU copy of that list (one small kernel)

Each sample evaluates `--calls` calls in one `mx.eval` between two synchronisations; the host
arrays are made before the timed region. Variants alternate in every round; the figure is the
median over rounds, in us per call.

    python benchmarks/metadata_placement.py --json-output placement.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

import pagekernels as pk
from pagepool import packed_int32
from qwen3model.provenance import collect_provenance

VARIANTS = ("pool", "device", "host", "host-padded", "host-packed", "host-copied")
HQ, HKV, D = 32, 8, 128
PAD_TO = 4  # int32 entries: 16 bytes, past the allocator's 8-byte scalar pool


def metadata_factory(
    variant: str, block_table: np.ndarray, lens: list[int]
) -> Callable[[], tuple[mx.array, mx.array]]:
    """A function giving (block_table, context_lens) for one call, placed as `variant` says."""
    batch, width = block_table.shape
    padded = lens + [0] * (-len(lens) % PAD_TO)  # as packed_int32 aligns its fields
    if variant in ("pool", "device"):
        table = mx.array(block_table)
        # `+ 0`: a GPU kernel writes them, into the scalar pool when at most 8 bytes.
        lengths = (mx.array(lens if variant == "pool" else padded, dtype=mx.int32) + 0)[:batch]
        mx.eval(table, lengths)
        return lambda: (table, lengths)
    rows = block_table.tolist()
    if variant == "host":
        return lambda: (mx.array(rows, dtype=mx.int32), mx.array(lens, dtype=mx.int32))
    if variant == "host-padded":
        return lambda: (mx.array(rows, dtype=mx.int32), mx.array(padded, dtype=mx.int32)[:batch])
    flat_table = block_table.reshape(-1).tolist()
    if variant == "host-packed":

        def packed() -> tuple[mx.array, mx.array]:
            table, lengths = packed_int32(flat_table, lens)  # as BatchMetadata makes them
            return table.reshape(batch, width), lengths

        return packed
    if variant == "host-copied":
        flat = padded + flat_table

        def copied() -> tuple[mx.array, mx.array]:
            # One kernel reads the list; its copy is device memory.
            both = mx.array(flat, dtype=mx.int32) + 0
            return both[len(padded) :].reshape(batch, width), both[:batch]

        return copied
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def time_case(
    batch: int, context: int, query_len: int, page_size: int, *, calls: int, rounds: int
) -> dict[str, object]:
    """Median us per call of every variant on one shape (fresh random inputs)."""
    rng = np.random.default_rng(0)
    pages = -(-context // page_size)
    k = mx.random.normal((batch * pages, HKV, page_size, D)).astype(mx.bfloat16)
    v = mx.random.normal((batch * pages, HKV, page_size, D)).astype(mx.bfloat16)
    q = mx.random.normal((batch, HQ, query_len, D)).astype(mx.bfloat16)
    block_table = rng.permutation(batch * pages).reshape(batch, pages).astype(np.int32)
    factories = {v_: metadata_factory(v_, block_table, [context] * batch) for v_ in VARIANTS}
    mx.eval(k, v, q)
    mask = "causal" if query_len > 1 else None
    expected = None
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(rounds + 1):  # round 0 warms up
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        for name in order:
            metadata = [factories[name]() for _ in range(calls)]
            outs = [pk.paged_attention(q, k, v, t, n, page_size, mask=mask) for t, n in metadata]
            mx.synchronize()
            start = time.perf_counter()
            mx.eval(outs)
            mx.synchronize()
            seconds = time.perf_counter() - start
            if expected is None:
                expected = outs[0]
            elif not mx.array_equal(outs[-1], expected).item():
                raise SystemExit(f"{name}: output differs from the first variant's")
            if round_:
                samples[name].append(seconds / calls * 1e6)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    return {
        "shape": {
            "batch": batch,
            "context": context,
            "query_len": query_len,
            "page_size": page_size,
        },
        "calls_per_sample": calls,
        "us_per_call": medians,
        "over_pool": {name: medians[name] / medians["pool"] for name in VARIANTS},
        "samples": samples,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["1x1024x1x16", "2x1024x1x16", "4x1024x1x16", "1x8192x1x16", "1x4096x4096x16"],
        help="BxCONTEXTxQUERY_LENxPAGE_SIZE (query_len > 1: causal prefill)",
    )
    parser.add_argument("--calls", type=int, default=32, help="calls per timed mx.eval")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json-output", type=Path)
    args = parser.parse_args(argv)
    if not mx.cuda.is_available():
        raise SystemExit("needs MLX's CUDA backend: the placements differ only there")
    mx.set_default_device(mx.gpu)
    results = []
    for case in args.cases:
        b, ctx, q_len, ps = (int(x) for x in case.split("x"))
        calls = max(4, args.calls // 8) if q_len > 1 else args.calls
        result = time_case(b, ctx, q_len, ps, calls=calls, rounds=args.rounds)
        results.append(result)
        cells = "  ".join(f"{n} {us:7.1f}" for n, us in result["us_per_call"].items())
        print(f"B={b} ctx={ctx} L={q_len} ps={ps}: us per call  {cells}", flush=True)
    if args.json_output:
        record = {
            "kind": "metadata_placement",
            "provenance": collect_provenance("gpu"),
            "results": results,
        }
        args.json_output.parent.mkdir(parents=True, exist_ok=True)
        args.json_output.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
