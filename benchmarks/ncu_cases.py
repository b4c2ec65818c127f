"""Kernel cases for Nsight Compute: each runs `paged_attention` twice on fresh random pages.

`scripts/gpu.sh profile` runs it under `ncu`; grids tell the cases apart in the report.

    ncu --section SpeedOfLight -k regex:attention python3 benchmarks/ncu_cases.py 1x8192x16
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np

import pagekernels as pk

HQ, HKV, D = 32, 8, 128


def run_case(batch: int, context: int, page_size: int, query_len: int = 1) -> None:
    """Two calls of the case `batch` x `context` tokens on shuffled pages of `page_size`."""
    rng = np.random.default_rng(0)
    pages = -(-context // page_size)
    num_pages = batch * pages
    k = mx.random.normal((num_pages, HKV, page_size, D)).astype(mx.bfloat16)
    v = mx.random.normal((num_pages, HKV, page_size, D)).astype(mx.bfloat16)
    block_table = mx.array(rng.permutation(num_pages).reshape(batch, pages).astype(np.int32))
    lens = mx.full((batch,), context, dtype=mx.int32)
    q = mx.random.normal((batch, HQ, query_len, D)).astype(mx.bfloat16)
    mx.eval(k, v, block_table, lens, q)
    for _ in range(2):
        mx.eval(pk.paged_attention(q, k, v, block_table, lens, page_size, mask="causal"))
    print(f"case B={batch} ctx={context} ps={page_size} L={query_len}", flush=True)


def main(argv: list[str]) -> int:
    for case in argv or ["1x8192x16", "8x1024x16", "1x128x128"]:
        run_case(*(int(part) for part in case.split("x")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
