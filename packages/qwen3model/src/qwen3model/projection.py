"""Projections through the kernel backend, and stacked projections with their checkpoint names.

`Projection` is an `mlx.nn.Linear` (no bias) whose product runs through `backend.linear`: the
few rows of a decode step take one kernel that reads each weight byte once, where MLX would call
cuBLASLt with a host cost above the weights' streaming time. Parameters, checkpoint names and
`nn.quantize` behave exactly as for `nn.Linear`.

`StackedProjection` holds the projections a layer applies to one input (q, k and v; gate and
up) as one weight stacked along N: one product streams all of them, and `backend.split_linear`
returns each part as its own array (contiguous where the kernel runs). Checkpoints keep the
parts' names (`q_proj.weight`, ...); `stack_checkpoint` and `unstack_checkpoint` convert
between the two.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = [
    "Projection",
    "QuantizedStackedProjection",
    "StackedProjection",
    "stack_checkpoint",
    "unstack_checkpoint",
]

# What `nn.QuantizedLinear` stores per output row, and so splits and stacks along axis 0.
_ROW_PARAMETERS = ("weight", "scales", "biases")


class Projection(nn.Linear):
    """`y = x @ weight.T` through `backend.linear`; `weight` is `[output_dims, input_dims]`.

    Args:
        input_dims: K.
        output_dims: N.
        backend: Kernel backend.
    """

    def __init__(self, input_dims: int, output_dims: int, backend: KernelBackend) -> None:
        super().__init__(input_dims, output_dims, bias=False)
        self.backend = backend

    def __call__(self, x: mx.array) -> mx.array:
        """Maps `[..., input_dims]` to `[..., output_dims]` in the weight's dtype."""
        return self.backend.linear(x, self.weight)


class StackedProjection(Projection):
    """Projections of one input with their weights stacked along N; returns one output per part.

    Args:
        input_dims: K.
        parts: Each part's checkpoint name (`q_proj`) and output width, in stacking order.
        backend: Kernel backend.

    Attributes:
        parts: Read-only name -> width mapping, in stacking order.
    """

    def __init__(self, input_dims: int, parts: Mapping[str, int], backend: KernelBackend) -> None:
        super().__init__(input_dims, sum(parts.values()), backend)
        self.parts = MappingProxyType(dict(parts))

    def __call__(self, x: mx.array) -> list[mx.array]:
        """Maps `[..., input_dims]` to one `[..., width]` array per part."""
        return self.backend.split_linear(x, self.weight, tuple(self.parts.values()))

    def to_quantized(
        self,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "affine",
        quantize_input: bool = False,
    ) -> QuantizedStackedProjection:
        """`nn.quantize`'s hook: the same parts over `mx.quantize`d stacked weights."""
        if quantize_input:
            raise ValueError("stacked projections quantize weights only (quantize_input=False)")
        quantized = QuantizedStackedProjection.from_linear(self, group_size, bits, mode)
        quantized.parts = self.parts
        return quantized


class QuantizedStackedProjection(nn.QuantizedLinear):
    """A quantized `StackedProjection`: `mx.quantized_matmul`, then split into the parts.

    Attributes:
        parts: Read-only name -> width mapping, in stacking order (set by `to_quantized` or
            `nn.quantize` of a `StackedProjection`).
    """

    parts: Mapping[str, int]

    def __call__(self, x: mx.array) -> list[mx.array]:
        """Maps `[..., input_dims]` to one `[..., width]` array per part."""
        return mx.split(super().__call__(x), _boundaries(self.parts), axis=-1)


def _boundaries(parts: Mapping[str, int]) -> list[int]:
    """Where each part after the first starts along N (`mx.split`'s indices)."""
    return list(itertools.accumulate(parts.values()))[:-1]


def _part_name(path: str, part: str, parameter: str) -> str:
    """`model.layers.0.self_attn.qkv_proj`, `q_proj`, `weight` ->
    `model.layers.0.self_attn.q_proj.weight`."""
    parent = path.rpartition(".")[0]
    return f"{parent}.{part}.{parameter}" if parent else f"{part}.{parameter}"


def _stacked_modules(model: nn.Module) -> dict[str, Mapping[str, int]]:
    return {
        path: module.parts
        for path, module in model.named_modules()
        if isinstance(module, StackedProjection | QuantizedStackedProjection)
    }


def stack_checkpoint(weights: Mapping[str, mx.array], model: nn.Module) -> dict[str, mx.array]:
    """Checkpoint weights with every part of `model`'s stacked projections concatenated under
    the stacked name (`...q_proj.weight`, `...k_proj.weight`, `...v_proj.weight` ->
    `...qkv_proj.weight`; likewise `scales` and `biases` of quantized checkpoints).

    Entries for other modules pass through; a projection none of whose parts is present is left
    for `apply_weights` to report.

    Raises:
        ValueError: Some parts of a stacked projection are present and others not, or a part
            has another number of rows than the model gives it.
    """
    stacked = dict(weights)
    for path, parts in _stacked_modules(model).items():
        for parameter in _ROW_PARAMETERS:
            names = {_part_name(path, part, parameter): width for part, width in parts.items()}
            present = [name for name in names if name in stacked]
            if not present:
                continue
            if len(present) < len(names):
                missing = [name for name in names if name not in stacked]
                raise ValueError(f"checkpoint has {present} but not {missing}")
            for name, width in names.items():
                if stacked[name].shape[0] != width:
                    raise ValueError(
                        f"checkpoint {name} has {stacked[name].shape[0]} rows, expected {width} "
                        "(the config's head counts and sizes)"
                    )
            stacked[f"{path}.{parameter}"] = mx.concatenate(
                [stacked.pop(name) for name in names], axis=0
            )
    return stacked


def unstack_checkpoint(weights: Mapping[str, mx.array], model: nn.Module) -> dict[str, mx.array]:
    """The inverse of `stack_checkpoint`: `model`'s parameters under checkpoint names."""
    modules = _stacked_modules(model)
    checkpoint: dict[str, mx.array] = {}
    for name, array in weights.items():
        path, _, parameter = name.rpartition(".")
        parts = modules.get(path)
        if parts is None or parameter not in _ROW_PARAMETERS:
            checkpoint[name] = array
            continue
        for part, piece in zip(parts, mx.split(array, _boundaries(parts), axis=0), strict=True):
            checkpoint[_part_name(path, part, parameter)] = piece
    return checkpoint
