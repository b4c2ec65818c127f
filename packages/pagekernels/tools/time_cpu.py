"""Times the CPU kernels against MLX's own SDPA on decode and prefill shapes.

Usage: python packages/pagekernels/tools/time_cpu.py [--iterations 30] [--repeats 5]
Prints a Markdown table: per op, the best (min over rounds) of each round's median time per call;
the ops alternate within a round.
K/V pages are scattered (a random permutation of page ids); MLX SDPA runs on dense K/V that
were gathered beforehand (its time excludes the gather).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

import pagekernels as pk

SHAPES = [  # (label, B, Hq, Hkv, L, D, context, page_size)
    ("decode", 4, 32, 8, 1, 128, 1024, 16),
    ("decode", 4, 32, 8, 1, 128, 128, 16),
    ("decode L=8", 4, 32, 8, 8, 128, 1024, 16),
    ("prefill", 1, 32, 8, 128, 128, 1024, 16),
]


def time_calls(fns: list[Callable[[], mx.array]], iterations: int, repeats: int) -> list[float]:
    """Milliseconds per call of each fn: min over `repeats` rounds of the median of `iterations`
    timed evals; the fns alternate within a round so that load from neighbours hits all alike."""
    for fn in fns:
        for _ in range(3):
            mx.eval(fn())
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            samples = []
            for _ in range(iterations):
                start = time.perf_counter()
                mx.eval(fn())
                samples.append(time.perf_counter() - start)
            best[i] = min(best[i], statistics.median(samples))
    return [t * 1e3 for t in best]


def time_shape(
    B: int, Hq: int, Hkv: int, L: int, D: int, context: int, page_size: int, dtype: mx.Dtype,
    iterations: int, repeats: int,
) -> tuple[float, float, float]:  # fmt: skip
    """(paged_attention, gather_kv + dense_attention, MLX SDPA) milliseconds per call."""
    pages_per_row = context // page_size
    P = B * pages_per_row
    queries = mx.random.normal((B, Hq, L, D)).astype(dtype)
    key_pages = mx.random.normal((P, Hkv, page_size, D)).astype(dtype)
    value_pages = mx.random.normal((P, Hkv, page_size, D)).astype(dtype)
    table = mx.random.permutation(P).astype(mx.int32).reshape(B, pages_per_row)
    lens = mx.full((B,), context, dtype=mx.int32)
    keys, values = pk.gather_kv(key_pages, value_pages, table, lens, page_size)
    mx.eval(queries, key_pages, value_pages, table, lens, keys, values)
    mask = "causal" if L > 1 else None

    def paged() -> mx.array:
        return pk.paged_attention(
            queries, key_pages, value_pages, table, lens, page_size, mask=mask
        )

    def gather_dense() -> mx.array:
        k, v = pk.gather_kv(key_pages, value_pages, table, lens, page_size)
        return pk.dense_attention(queries, k, v, mask=mask, key_lens=lens)

    def sdpa() -> mx.array:
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=D**-0.5, mask=mask)

    t_paged, t_dense, t_sdpa = time_calls([paged, gather_dense, sdpa], iterations, repeats)
    return t_paged, t_dense, t_sdpa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mx.set_default_device(mx.cpu)
    print(
        "| shape | dtype | paged_attention | gather_kv + dense_attention | MLX SDPA | SDPA/paged |"
    )
    print("|---|---|---|---|---|---|")
    for label, B, Hq, Hkv, L, D, context, page_size in SHAPES:
        for dtype in (mx.float32, mx.bfloat16, mx.float16):
            t_paged, t_dense, t_sdpa = time_shape(
                B, Hq, Hkv, L, D, context, page_size, dtype, args.iterations, args.repeats
            )
            name = f"{label} B={B} Hq={Hq} Hkv={Hkv} L={L} D={D} ctx={context} ps={page_size}"
            print(
                f"| {name} | {str(dtype).split('.')[-1]} | {t_paged:.2f} ms | {t_dense:.2f} ms "
                f"| {t_sdpa:.2f} ms | {t_sdpa / t_paged:.1f}x |"
            )


if __name__ == "__main__":
    main()
