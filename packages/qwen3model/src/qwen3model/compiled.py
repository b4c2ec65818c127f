"""`CompiledDecode`: paged decode steps through `mx.compile`, one trace per shape.

The engine pads decode batches and block-table widths to buckets, so shapes repeat and a trace
is reused. Only the paged path is compiled: Python code (such as the gather path's byte
counters) runs once per trace, not once per step. `write_kv` writes in place under compile
too; outputs equal the uncompiled step exactly (tested).

The model's parameters are captured inputs of the trace (`mx.compile(..., inputs=model.state)`),
not constants baked into it: weights assigned after tracing (`update`, `load_weights`) are the
ones the next call uses. MLX retraces when the captured arrays change in number, shape or
dtype; `reset` drops the traces that can never run again (`Qwen3Model.quantize` swaps layers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from pagepool import BatchMetadata, KVStorage
from qwen3model.paged import PagedStepAttention

if TYPE_CHECKING:
    from qwen3model.model import Qwen3Model

__all__ = ["CompiledDecode"]

_DecodeFn = Callable[..., tuple[mx.array, list[mx.array], list[mx.array]]]


class _LayerArrays:
    """The traced page arrays of every layer (stands in for `KVStorage` inside the trace)."""

    def __init__(self, keys: list[mx.array], values: list[mx.array]) -> None:
        self.keys, self.values = list(keys), list(values)

    def update_layer(self, layer: int, keys: mx.array, values: mx.array) -> None:
        self.keys[layer], self.values[layer] = keys, values


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TracedPages:
    """The traced page tables (stands in for `BatchMetadata` inside the trace)."""

    block_table: mx.array
    context_lens: mx.array
    slot_mapping: mx.array
    page_size: int


class CompiledDecode:
    """Runs a model's paged decode steps (`L = 1`) as compiled graphs.

    Args:
        model: The model whose layers and kernel backend the traces use.
    """

    def __init__(self, model: Qwen3Model) -> None:
        self._model = model
        self._functions: dict[int, _DecodeFn] = {}  # by page size (a trace constant)

    def __call__(self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage) -> mx.array:
        """Same contract as `Qwen3Model.step` for `metadata.query_len == 1`."""
        function = self._functions.get(metadata.page_size)
        if function is None:
            decode = self._decode_function(metadata.page_size)
            function = mx.compile(decode, inputs=self._model.state)
            self._functions[metadata.page_size] = function
        logits, keys, values = function(
            tokens,
            metadata.positions,
            metadata.block_table,
            metadata.context_lens,
            metadata.slot_mapping,
            list(kv.keys),
            list(kv.values),
        )
        kv.update_layers(keys, values)
        return logits

    def reset(self) -> None:
        """Drops every trace; the next call traces the model as it is then."""
        self._functions.clear()

    def _decode_function(self, page_size: int) -> _DecodeFn:
        model = self._model
        scale = model.args.head_dim**-0.5

        def decode(
            tokens: mx.array,
            positions: mx.array,
            block_table: mx.array,
            context_lens: mx.array,
            slot_mapping: mx.array,
            keys: list[mx.array],
            values: list[mx.array],
        ) -> tuple[mx.array, list[mx.array], list[mx.array]]:
            pages = _LayerArrays(keys, values)
            tables = _TracedPages(
                block_table=block_table,
                context_lens=context_lens,
                slot_mapping=slot_mapping,
                page_size=page_size,
            )
            attention = PagedStepAttention(model.backend, pages, tables, scale)
            hidden = model.model(tokens, positions, attention)  # L = 1: positions are offsets
            return model.logits(hidden), pages.keys, pages.values

        return decode
