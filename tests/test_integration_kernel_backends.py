"""The shipped kernel backends agree on a whole bfloat16 model: `native` (on a GPU: the linear,
write and paged attention kernels of a decode step) against `reference` (readable mlx.core)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from pagekernels import get_backend
from qwen3model import build_synthetic


def test_native_and_reference_decode_agree_in_bfloat16(make_driver) -> None:
    logits = {}
    for kernels in ("native", "reference"):
        model, _ = build_synthetic(
            "qwen3-small", backend=get_backend(kernels), dtype=mx.bfloat16, seed=3
        )
        driver = make_driver(model, page_size=16)
        rows = [driver.new_row() for _ in range(4)]
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, model.args.vocab_size, n).tolist() for n in (5, 17, 33, 2)]
        for b, prompt in enumerate(prompts):  # prefill one row at a time (lengths differ)
            only_b = [row if i == b else None for i, row in enumerate(rows)]
            driver.step(only_b, [prompt if i == b else [] for i in range(4)], max_pages=4)
        logits[kernels] = [
            driver.step(
                rows,
                [[int(t)] for t in rng.integers(0, model.args.vocab_size, 4)],
                max_pages=4,
            )
            for _ in range(3)
        ]
    for native, reference in zip(logits["native"], logits["reference"], strict=True):
        a, b = np.array(native), np.array(reference)
        assert np.isfinite(a).all()
        scale = np.abs(b).max()
        np.testing.assert_allclose(a, b, rtol=0, atol=0.03 * scale)
