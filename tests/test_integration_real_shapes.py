"""`synthetic:qwen3-0.6b` (Qwen3-0.6B's published shape, bfloat16) served by the engine."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from pageruntime import Engine, SamplingParams
from qwen3model import load_model


@pytest.mark.slow
def test_qwen3_0_6b_shape_serves_two_requests() -> None:
    model, tokenizer = load_model("synthetic:qwen3-0.6b", dtype=mx.bfloat16)
    sizes = {name: a.size for name, a in tree_flatten(model.parameters())}
    non_embedding = sum(sizes.values()) - sizes["model.embed_tokens.weight"]
    # The model card: 0.6B parameters, 0.44B of them outside the (tied) embedding.
    assert round(sum(sizes.values()) / 1e9, 1) == 0.6
    assert round(non_embedding / 1e9, 2) == 0.44
    engine = Engine(model, num_pages=8, page_size=16, max_batch_size=2, prefill_step=16)
    prompts = [tokenizer.encode("Qwen3"), tokenizer.encode("x" * 20)]
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=3))
    assert [len(o.output_ids) for o in outputs] == [3, 3]
    assert all(0 <= t < model.args.vocab_size for o in outputs for t in o.output_ids)
    stats = engine.stats
    assert stats.prefill_tokens == sum(len(p) for p in prompts)
    assert stats.pool.num_live_pages == 0 and stats.pool.peak_live_pages == 1 + 2
