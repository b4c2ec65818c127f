"""Kernel cases for Nsight Compute: each runs `paged_attention` twice on fresh random pages.

`scripts/gpu.sh profile` runs it under `ncu`; grids tell the cases apart in the report. With
`--sdpa`, each case runs MLX's SDPA twice instead, on dense K/V of the same shape (the library
kernel the operator benchmark compares against; `gpu.sh sdpa-profile`).

    ncu --section SpeedOfLight -k regex:attention python3 benchmarks/ncu_cases.py 1x8192x16
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np

import pagekernels as pk
from pagepool import BatchMetadata

HQ, HKV, D = 32, 8, 128


def run_case(batch: int, context: int, page_size: int, query_len: int = 1) -> None:
    """Two calls of the case `batch` x `context` tokens on shuffled pages of `page_size`."""
    rng = np.random.default_rng(0)
    pages = -(-context // page_size)
    num_pages = batch * pages
    k = mx.random.normal((num_pages, HKV, page_size, D)).astype(mx.bfloat16)
    v = mx.random.normal((num_pages, HKV, page_size, D)).astype(mx.bfloat16)
    # Placed in memory as the runtime places them (views of one array made from host lists: the
    # first launch migrates it, so profile the second).
    metadata = BatchMetadata.from_host(
        rng.permutation(num_pages).reshape(batch, pages).tolist(),
        [context] * batch,
        query_len=query_len,
        page_size=page_size,
        num_pages=num_pages,
    )
    block_table, lens = metadata.block_table, metadata.context_lens
    q = mx.random.normal((batch, HQ, query_len, D)).astype(mx.bfloat16)
    mx.eval(k, v, block_table, lens, q)
    for _ in range(2):
        mx.eval(pk.paged_attention(q, k, v, block_table, lens, page_size, mask="causal"))
    print(f"case B={batch} ctx={context} ps={page_size} L={query_len}", flush=True)


def run_sdpa_case(batch: int, context: int, page_size: int, query_len: int = 1) -> None:
    """Two calls of MLX SDPA on dense K/V of the case's shape (`page_size` is not used)."""
    k = mx.random.normal((batch, HKV, context, D)).astype(mx.bfloat16)
    v = mx.random.normal((batch, HKV, context, D)).astype(mx.bfloat16)
    q = mx.random.normal((batch, HQ, query_len, D)).astype(mx.bfloat16)
    mx.eval(k, v, q)
    mask = "causal" if query_len > 1 else None
    for _ in range(2):
        mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask))
    print(f"sdpa case B={batch} ctx={context} L={query_len}", flush=True)


def main(argv: list[str]) -> int:
    sdpa = argv[:1] == ["--sdpa"]
    run = run_sdpa_case if sdpa else run_case
    for case in argv[sdpa:] or ["1x8192x16", "8x1024x16", "1x128x128"]:
        run(*(int(part) for part in case.split("x")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
