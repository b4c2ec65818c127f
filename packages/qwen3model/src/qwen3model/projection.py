"""`Projection`: an `mlx.nn.Linear` (no bias) whose product runs through the kernel backend.

The backend's `linear` takes the few rows of a decode step through one kernel that reads each
weight byte once, where MLX would call cuBLASLt with a host cost above the weights' streaming
time. Parameters, checkpoint names and `nn.quantize` behave exactly as for `nn.Linear`
(quantizing replaces a projection with `nn.QuantizedLinear`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["Projection"]


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
