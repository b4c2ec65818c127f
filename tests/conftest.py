"""Integration fixtures: tiny float32 Qwen3 models on each attention path, a step driver that
appends tokens to page lists and calls `model.step` directly, and a no-cache oracle (MLX SDPA,
tests only). Helpers are handed out as fixtures (pytest runs in importlib mode)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import KernelBackend, get_backend
from pagepool import BatchMetadata, PageList, PagePool
from qwen3model import AttentionMode, Qwen3Model, build_synthetic

POISON = float("nan")

# These tests compare float32 paths at 1e-4 .. 1e-5. MLX's CUDA backend runs float32 matmuls as
# TF32 by default (10-bit mantissas), which alone moves log-probabilities by ~3e-4 between a
# one-row and a four-row product; read once, at the first matmul, so set before any runs.
os.environ.setdefault("MLX_ENABLE_TF32", "0")


def tiny_model(backend: KernelBackend, mode: AttentionMode | str = "paged") -> Qwen3Model:
    """`synthetic:qwen3-tiny`, float32, seed 0, on attention path `mode`."""
    model, _ = build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32, attention_mode=mode)
    return model


class StepDriver:
    """Drives `model.step` by hand: one pool, NaN-poisoned storage, rows appended per call."""

    def __init__(self, model: Qwen3Model, *, page_size: int, num_pages: int = 64) -> None:
        self.model = model
        self.pool = PagePool(page_size, num_pages)
        self.kv = model.make_kv_storage(self.pool, fill_value=POISON)

    def new_row(self) -> PageList:
        return PageList(self.pool)

    def step(
        self, rows: Sequence[PageList | None], tokens: Sequence[Sequence[int]], max_pages: int = 16
    ) -> mx.array:
        """Appends `tokens[b]` to `rows[b]` (None: a padding row), runs one step; returns
        float32 logits `[B, vocab]`. Every real row must get the same number of tokens."""
        L = max(len(t) for t in tokens)
        for row, row_tokens in zip(rows, tokens, strict=True):
            if row is not None:
                row.append(len(row_tokens))
        metadata = BatchMetadata.build(rows, query_len=L, max_pages=max_pages)
        padded = [
            list(t) if row is not None else [0] * L for row, t in zip(rows, tokens, strict=True)
        ]
        logits = self.model.step(mx.array(padded, dtype=mx.int32), metadata, self.kv)
        mx.eval(logits)
        return logits


class _FullSequenceAttention:
    """Oracle: MLX's SDPA over the whole sequence, no cache at all (tests only)."""

    copied_bytes = 0

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, layer: int, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=self.scale, mask="causal"
        )


def oracle_logits(model: Qwen3Model, tokens: Sequence[int]) -> mx.array:
    """float32 `[vocab]` next-token logits after `tokens`, recomputed from scratch."""
    attention = _FullSequenceAttention(model.args.head_dim**-0.5)
    hidden = model.model(mx.array([list(tokens)], dtype=mx.int32), mx.array([0]), attention)
    return model.logits(hidden)[0]


def log_softmax(logits: mx.array) -> np.ndarray:
    """float64 log-probabilities of float logits `[..., vocab]`."""
    x = np.array(logits, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="session")
def backend() -> KernelBackend:
    """The shipped kernels (native extension)."""
    return get_backend("native")


@pytest.fixture(scope="session")
def make_tiny() -> Callable[..., Qwen3Model]:
    """`make_tiny(mode="paged", kernels="native")`: a fresh float32 `synthetic:qwen3-tiny`
    (seed 0) on attention path `mode` with the named kernel backend."""
    return lambda mode="paged", kernels="native": tiny_model(get_backend(kernels), mode)


@pytest.fixture(scope="session")
def make_driver() -> type[StepDriver]:
    """`StepDriver(model, page_size=...)`."""
    return StepDriver


@pytest.fixture(scope="session")
def oracle() -> Callable[[Qwen3Model, Sequence[int]], mx.array]:
    """`oracle(model, tokens)`: next-token logits recomputed without any cache."""
    return oracle_logits


@pytest.fixture(scope="session")
def logprobs() -> Callable[[mx.array], np.ndarray]:
    """`logprobs(logits)`: float64 log-softmax."""
    return log_softmax
