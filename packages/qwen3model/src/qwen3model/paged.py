"""Step attention over K/V pages: `PagedStepAttention` (write_kv + paged_attention, or whole
decoder layers through `backend.decoder_layer`: the serving path) and `GatherStepAttention`
(write_kv + gather_kv + dense_attention, the ablation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from qwen3model.attention import attend_dense

if TYPE_CHECKING:
    from pagekernels import DecoderLayerWeights, KernelBackend

__all__ = ["GatherStepAttention", "PageArrays", "PagedStepAttention", "StepPages"]


class PageArrays(Protocol):
    """Per-layer K/V page arrays (`pagepool.KVStorage`, or a stand-in inside `mx.compile`)."""

    @property
    def keys(self) -> tuple[mx.array, ...] | list[mx.array]: ...

    @property
    def values(self) -> tuple[mx.array, ...] | list[mx.array]: ...

    def update_layer(self, layer: int, keys: mx.array, values: mx.array) -> None: ...


class StepPages(Protocol):
    """The step's page tables (`pagepool.BatchMetadata`, or a stand-in inside `mx.compile`)."""

    block_table: mx.array
    context_lens: mx.array
    slot_mapping: mx.array
    page_size: int


class _PagedStore:
    """What both page-backed step attentions share: the store, the tables, and the K/V write.

    Args:
        backend: Kernel backend.
        kv: Per-layer page arrays; updated in place through `update_layer`.
        metadata: The step's block table, context lengths and slot mapping.
        scale: Softmax scale (`head_dim ** -0.5`).
    """

    def __init__(
        self, backend: KernelBackend, kv: PageArrays, metadata: StepPages, scale: float
    ) -> None:
        self.backend = backend
        self.kv = kv
        self.metadata = metadata
        self.scale = scale
        self.copied_bytes = 0

    def write(self, layer: int, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Stores `keys`/`values` `[B, Hkv, L, D]` at the step's slots; returns the layer's
        updated `(key_pages, value_pages)`, each `[P, Hkv, page_size, D]`."""
        B, Hkv, L, D = keys.shape
        key_pages, value_pages = self.backend.write_kv(
            self.kv.keys[layer],
            self.kv.values[layer],
            keys.transpose(0, 2, 1, 3).reshape(B * L, Hkv, D),
            values.transpose(0, 2, 1, 3).reshape(B * L, Hkv, D),
            self.metadata.slot_mapping,
        )
        self.kv.update_layer(layer, key_pages, value_pages)
        return key_pages, value_pages


class PagedStepAttention(_PagedStore):
    """Writes each layer's new K/V into its pages, then runs `paged_attention` on the pages; or
    runs a whole decoder layer through `backend.decoder_layer` (`decoder_layer`).

    Args:
        backend: Kernel backend.
        kv: Per-layer page arrays; updated in place through `update_layer`.
        metadata: The step's block table, context lengths and slot mapping.
        scale: Softmax scale (`head_dim ** -0.5`).

    Attributes:
        copied_bytes: K/V bytes copied outside the pages this step (always 0 here).
    """

    def __call__(self, layer: int, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        """See `StepAttention`."""
        key_pages, value_pages = self.write(layer, keys, values)
        md = self.metadata
        return self.backend.paged_attention(
            queries,
            key_pages,
            value_pages,
            md.block_table,
            md.context_lens,
            md.page_size,
            scale=self.scale,
            mask="causal",
        )

    def decoder_layer(
        self,
        layer: int,
        residual: mx.array,
        pending: mx.array | None,
        weights: DecoderLayerWeights,
        offsets: mx.array,
        *,
        eps: float,
        rope_base: float,
    ) -> tuple[mx.array, mx.array]:
        """Runs layer `layer` on the residual stream `[B, L, H]` plus `pending` (the previous
        layer's MLP output, or None) with `backend.decoder_layer`, storing its K/V; `offsets`
        int32 `[B]` is each row's first position. Returns `(h, mlp_output)`."""
        md = self.metadata
        h, mlp, key_pages, value_pages = self.backend.decoder_layer(
            residual,
            pending,
            weights,
            self.kv.keys[layer],
            self.kv.values[layer],
            md.block_table,
            md.context_lens,
            md.slot_mapping,
            offsets,
            md.page_size,
            eps=eps,
            rope_base=rope_base,
            scale=self.scale,
        )
        self.kv.update_layer(layer, key_pages, value_pages)
        return h, mlp


class GatherStepAttention(_PagedStore):
    """Writes K/V into pages like the paged path, then gathers each row's pages into a dense
    `[B, Hkv, max_pages * page_size, D]` tensor and runs `dense_attention` on it.

    `copied_bytes` counts the K and V bytes every gather materialises (from shapes, on the
    host: no synchronisation).
    """

    def __call__(self, layer: int, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        """See `StepAttention`."""
        key_pages, value_pages = self.write(layer, keys, values)
        md = self.metadata
        dense_keys, dense_values = self.backend.gather_kv(
            key_pages, value_pages, md.block_table, md.context_lens, md.page_size
        )
        self.copied_bytes += dense_keys.nbytes + dense_values.nbytes
        return attend_dense(
            self.backend,
            queries,
            dense_keys,
            dense_values,
            key_lens=md.context_lens,
            scale=self.scale,
        )
