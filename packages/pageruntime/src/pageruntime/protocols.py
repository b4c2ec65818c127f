"""What the engine is given: a model that runs one step (and makes the K/V store its steps
write), and a sampler.

The engine never imports a model or a kernel; anything with these methods will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx

from pagepool import BatchMetadata, PageCopy, PagePool
from pageruntime.sampling import SamplingParams

__all__ = ["KVStore", "Sampler", "StepModel"]


@runtime_checkable
class KVStore(Protocol):
    """What the engine needs of a model's K/V storage: `pagepool.KVStorage` (pages) is one,
    and so is any other store (the dense baseline keeps per-request caches).

    Attributes:
        pool: The engine's page pool the store was made for.
    """

    @property
    def pool(self) -> PagePool: ...

    def copy_pages(self, copies: Sequence[PageCopy]) -> None:
        """Makes the step's copy-on-write copies (`dst` := `src`), lazily, before it runs."""
        ...

    def step_arrays(self) -> list[mx.array]:
        """The arrays a step writes; the engine evaluates them with the step's tokens."""
        ...

    def snapshot(self) -> Any:
        """A token `restore` takes back, taken before a step (its type is the store's own)."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Returns to `snapshot` after a step whose arrays failed to evaluate (the step's
        requests all fail, so data they wrote in place may stay). Must not raise: the engine
        calls it while handling that failure."""
        ...


@runtime_checkable
class StepModel(Protocol):
    """A model the engine can drive, one batched call per prefill chunk or decode step.

    Attributes:
        max_seq_len: Most tokens (prompt plus output) one request may hold.
        vocab_size: Token ids are in `[0, vocab_size)`; the width of the logits `step`
            returns. The engine rejects prompts and stop tokens outside it.
    """

    @property
    def max_seq_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def make_kv_storage(self, pool: PagePool) -> KVStore:
        """The K/V store for `pool` (pages: a `pagepool.KVStorage`); the engine owns it."""
        ...

    def step(self, tokens: mx.array, metadata: BatchMetadata, kv: KVStore) -> mx.array:
        """Run every layer on `tokens`, writing their K/V at `metadata.slot_mapping`.

        Must not synchronise with the host: the engine evaluates once per step.

        Args:
            tokens: int32 `[B, L]`; row b's tokens are the last `L` of its context.
                Padding rows (context length 0) hold 0 and give logits the engine ignores.
            metadata: Page tables of the `B` rows, shared by every layer.
            kv: The store `make_kv_storage` returned, to read and write.

        Returns:
            `[B, vocab_size]` logits of the last position of every row.
        """
        ...


class Sampler(Protocol):
    """Picks the next token of each row; `pageruntime.sample_tokens` is the default."""

    def __call__(
        self, logits: mx.array, params: Sequence[SamplingParams], token_indices: Sequence[int]
    ) -> mx.array:
        """Pick one token per row.

        Args:
            logits: `[B, V]` logits of the real rows (padding rows removed).
            params: Each row's sampling parameters.
            token_indices: Each row's index of the output token being sampled.

        Returns:
            int32 `[B]` token ids, unevaluated; the engine evaluates once per step.
        """
        ...
