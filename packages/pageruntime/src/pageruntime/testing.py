"""Deterministic fake models and samplers for testing an engine (or code that drives one).

`ContextHashModel` writes every token into its KV pages and reads the whole context back
through the block table, so its next token is a hash of exactly what the pages hold: a wrong
page mapping, a lost write, a bad context length or a preemption bug changes the output.
`reference_output` computes the same tokens in plain Python, as an oracle.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import mlx.core as mx

from pagepool import BatchMetadata, KVStorage, PagePool
from pageruntime.sampling import SamplingParams, sample_tokens

__all__ = [
    "VOCAB_SIZE",
    "ContextHashModel",
    "FailingModel",
    "FailingSampler",
    "context_hash",
    "random_prompts",
    "reference_output",
]

VOCAB_SIZE = 61
"""Vocabulary of the fake models."""


def _weight(position: int) -> int:
    return (position * 37 + 11) % 101 + 1


def context_hash(context: Sequence[int]) -> int:
    """The fake model's greedy next token after `context` (the Python oracle)."""
    return sum((token + 1) * _weight(j) for j, token in enumerate(context)) % VOCAB_SIZE


def reference_output(
    prompt: Sequence[int], params: SamplingParams, *, max_seq_len: int
) -> list[int]:
    """What greedy decoding with `ContextHashModel` must produce, computed in plain Python."""
    if not params.greedy:
        raise ValueError("reference_output follows greedy decoding only (temperature 0)")
    context, output = list(prompt), []
    while True:
        token = context_hash(context)
        output.append(token)
        context.append(token)
        if (
            token in params.stop_token_ids
            or len(output) >= params.max_new_tokens
            or len(context) >= max_seq_len
        ):
            return output


class ContextHashModel:
    """A `StepModel` whose logits peak at `context_hash` of the context read from its pages.

    Every layer stores K = token id and V = position at `metadata.slot_mapping`; the output
    reads tokens from the last layer's K and positions from the first layer's V, through
    `metadata.block_table` and `metadata.context_lens`. Unused storage is NaN, so reading a
    slot that was never written corrupts the hash.

    Args:
        max_seq_len: The model's limit on prompt plus output tokens.
        num_layers: K/V page array pairs in its storage.

    Attributes:
        vocab_size: `VOCAB_SIZE`; token ids are in `[0, VOCAB_SIZE)`.
        calls: `(B, L, max_pages)` of every call, in order.
        storage: The storage made by the latest `make_kv_storage`.
    """

    vocab_size = VOCAB_SIZE

    def __init__(self, *, max_seq_len: int = 256, num_layers: int = 2) -> None:
        self.max_seq_len = max_seq_len
        self.num_layers = num_layers
        self.calls: list[tuple[int, int, int]] = []
        self.storage: KVStorage | None = None

    def make_kv_storage(self, pool: PagePool) -> KVStorage:
        """float32 storage of `num_layers` layers, one head of one dim, poisoned with NaN."""
        self.storage = KVStorage(
            pool,
            num_layers=self.num_layers,
            num_kv_heads=1,
            head_dim=1,
            dtype=mx.float32,
            fill_value=float("nan"),
        )
        return self.storage

    def step(self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage) -> mx.array:
        """Write the tokens, read every row's context back, and score its hash.

        Args:
            tokens: int32 `[B, L]`, the new tokens of each row.
            metadata: The call's page tables.
            kv: The storage to write and read.

        Returns:
            float32 `[B, VOCAB_SIZE]` logits, highest (0) at each row's `context_hash`.
        """
        B, L = tokens.shape
        self.calls.append((B, L, metadata.max_pages))
        for layer in range(kv.num_layers):
            keys = _write(kv.keys[layer], metadata.slot_mapping, tokens.reshape(-1))
            values = _write(kv.values[layer], metadata.slot_mapping, metadata.positions)
            kv.update_layer(layer, keys, values)
        context, valid = _read(kv.keys[-1], metadata)
        positions, _ = _read(kv.values[0], metadata)
        j = mx.arange(context.shape[1])
        weights = (j * 37 + 11) % 101 + 1
        total = (((context + 1) * weights) * valid).sum(axis=1)
        misplaced = (valid & (positions != j)).sum(axis=1)
        h = (total + 17 * misplaced) % VOCAB_SIZE
        distance = (mx.arange(VOCAB_SIZE)[None, :] - h[:, None]) % VOCAB_SIZE
        return -0.5 * distance.astype(mx.float32)


def _write(pages: mx.array, slots: mx.array, values: mx.array) -> mx.array:
    """Scatter one value per new token; padding slots (-1) go to a scratch element."""
    P, H, page_size, D = pages.shape
    flat = mx.concatenate([pages.reshape(-1), mx.zeros((1,), pages.dtype)])
    flat[mx.where(slots >= 0, slots, P * page_size)] = values.astype(pages.dtype)
    return flat[:-1].reshape(P, H, page_size, D)


def _read(pages: mx.array, metadata: BatchMetadata) -> tuple[mx.array, mx.array]:
    """Gather every row's context (int32 `[B, max_pages * page_size]`) and its validity."""
    page_size = metadata.page_size
    j = mx.arange(metadata.max_pages * page_size)
    page_ids = metadata.block_table[:, j // page_size]
    slots = mx.maximum(page_ids, 0) * page_size + j % page_size
    valid = j[None, :] < metadata.context_lens[:, None]
    gathered = mx.where(valid, pages.reshape(-1)[slots], 0)
    return gathered.astype(mx.int32), valid


class FailingModel(ContextHashModel):
    """`ContextHashModel` that fails the calls where `fail_when(metadata)` is true.

    Args:
        fail_when: Predicate on the call's metadata (host fields only).
        lazy: Fail at evaluation instead of raising in `step` (the logits depend on an
            inverse of a singular matrix, which raises only when evaluated).
        max_seq_len: As `ContextHashModel`.
        num_layers: As `ContextHashModel`.
    """

    def __init__(
        self,
        fail_when: Callable[[BatchMetadata], bool],
        *,
        lazy: bool = False,
        max_seq_len: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__(max_seq_len=max_seq_len, num_layers=num_layers)
        self.fail_when = fail_when
        self.lazy = lazy
        self.num_failures = 0

    def step(self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage) -> mx.array:
        logits = super().step(tokens, metadata, kv)
        if not self.fail_when(metadata):
            return logits
        self.num_failures += 1
        if not self.lazy:
            raise RuntimeError("model exploded")
        poison = mx.linalg.inv(mx.zeros((2, 2)), stream=mx.cpu)[0, 0]
        # The storage depends on the poison too, as a failed kernel's output would.
        for layer in range(kv.num_layers):
            kv.update_layer(layer, kv.keys[layer] + 0 * poison, kv.values[layer])
        return logits + poison


class FailingSampler:
    """`sample_tokens`, except that it raises when `fail_when(params, token_indices)`."""

    def __init__(
        self, fail_when: Callable[[Sequence[SamplingParams], Sequence[int]], bool]
    ) -> None:
        self.fail_when = fail_when
        self.num_failures = 0

    def __call__(
        self, logits: mx.array, params: Sequence[SamplingParams], token_indices: Sequence[int]
    ) -> mx.array:
        if self.fail_when(params, token_indices):
            self.num_failures += 1
            raise ValueError("sampler exploded")
        return sample_tokens(logits, params, token_indices)


def random_prompts(rng: random.Random, n: int, *, max_len: int) -> list[list[int]]:
    """`n` prompts of 1..max_len random token ids."""
    return [[rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, max_len))] for _ in range(n)]
