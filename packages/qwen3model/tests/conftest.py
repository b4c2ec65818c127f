"""Shared fixtures: kernel backends, tiny synthetic models and a one-call prefill helper."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import pytest

from pagekernels import KernelBackend, get_backend
from pagepool import BatchMetadata, PageList, PagePool
from qwen3model import Qwen3Model, Tokenizer, build_synthetic

PrefillFn = Callable[[Qwen3Model, Sequence[int]], mx.array]


@pytest.fixture(scope="session")
def backend() -> KernelBackend:
    """The shipped kernels (the native extension)."""
    return get_backend("native")


@pytest.fixture
def tiny(backend: KernelBackend) -> tuple[Qwen3Model, Tokenizer]:
    """A float32 `synthetic:qwen3-tiny` on the paged path."""
    return build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32, seed=0)


@pytest.fixture
def prefill() -> PrefillFn:
    """Runs a prompt through `model.step` in one call; returns float32 logits `[vocab]`."""

    def run(model: Qwen3Model, prompt_ids: Sequence[int], page_size: int = 4) -> mx.array:
        pool = PagePool(page_size, -(-len(prompt_ids) // page_size) + 1)
        kv = model.make_kv_storage(pool)
        pages = PageList(pool)
        pages.append(len(prompt_ids))
        metadata = BatchMetadata.build([pages], query_len=len(prompt_ids))
        tokens = mx.array([list(prompt_ids)], dtype=mx.int32)
        logits = model.step(tokens, metadata, kv)
        mx.eval(logits)
        return logits[0]

    return run
