"""The `KernelBackend` interface and its registry (entry-point group `pagekernels.backends`).

`native` (compiled kernels) and `reference` (readable `mlx.core`) ship with this package, each a
`ModuleBackend` over its module's functions; any installed distribution can add one by
declaring an entry point in that group whose object implements `KernelBackend`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from types import ModuleType
from typing import Literal, NamedTuple, Protocol

import mlx.core as mx

__all__ = [
    "ENTRY_POINT_GROUP",
    "DecoderLayerWeights",
    "KernelBackend",
    "ModuleBackend",
    "available_backends",
    "get_backend",
]

ENTRY_POINT_GROUP = "pagekernels.backends"


class DecoderLayerWeights(NamedTuple):
    """One pre-norm Qwen3 decoder layer's weights, all of one float dtype (H: hidden size,
    I: intermediate size; the projections in `mlx.nn.Linear`'s `[N, K]` layout)."""

    input_layernorm: mx.array  #: `[H]`
    qkv_proj: mx.array  #: `[Hq*D + 2*Hkv*D, H]`: q_proj, k_proj, v_proj stacked
    q_norm: mx.array  #: `[D]`
    k_norm: mx.array  #: `[D]`
    o_proj: mx.array  #: `[H, Hq*D]`
    post_attention_layernorm: mx.array  #: `[H]`
    gate_up_proj: mx.array  #: `[2*I, H]`: gate_proj, then up_proj
    down_proj: mx.array  #: `[H, I]`


class KernelBackend(Protocol):
    """The ten kernel ops the model calls (shape letters as in `pagekernels`)."""

    @property
    def name(self) -> str:
        """The backend's registry name."""
        ...

    def paged_attention(
        self,
        queries: mx.array,
        key_pages: mx.array,
        value_pages: mx.array,
        block_table: mx.array,
        context_lens: mx.array,
        page_size: int,
        *,
        scale: float | None = None,
        mask: Literal["causal"] | None = None,
    ) -> mx.array:
        """queries `[B,Hq,L,D]`, pages `[P,Hkv,ps,D]`, block_table int32 `[B,max_pages]`,
        context_lens int32 `[B]` -> `[B,Hq,L,D]` in the queries' dtype."""
        ...

    def write_kv(
        self,
        key_pages: mx.array,
        value_pages: mx.array,
        keys: mx.array,
        values: mx.array,
        slot_mapping: mx.array,
    ) -> tuple[mx.array, mx.array]:
        """keys/values `[T,Hkv,D]` into slots int32 `[T]` (negative skipped) -> updated pages."""
        ...

    def gather_kv(
        self,
        key_pages: mx.array,
        value_pages: mx.array,
        block_table: mx.array,
        context_lens: mx.array,
        page_size: int,
    ) -> tuple[mx.array, mx.array]:
        """-> dense `([B,Hkv,max_pages*ps,D], same)`, zeros past each row's context."""
        ...

    def dense_attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float | None = None,
        mask: Literal["causal"] | None = None,
        key_lens: mx.array | None = None,
    ) -> mx.array:
        """queries `[B,Hq,L,D]`, keys/values `[B,Hkv,S,D]`, key_lens int32 `[B]` | None
        -> `[B,Hq,L,D]`."""
        ...

    def quantized_embedding(
        self,
        indices: mx.array,
        weight: mx.array,
        scales: mx.array,
        biases: mx.array,
        *,
        group_size: int,
        bits: int,
    ) -> mx.array:
        """Integer indices `[...]` of an `mx.quantize`d table -> `[..., dims]` (scales' dtype)."""
        ...

    def linear(self, x: mx.array, weight: mx.array) -> mx.array:
        """x `[..., K]` @ weight `[N, K]`.T -> `[..., N]` (a projection of `mlx.nn.Linear`),
        in the promoted dtype of x and weight, as `mx.matmul`."""
        ...

    def split_linear(self, x: mx.array, weight: mx.array, widths: Sequence[int]) -> list[mx.array]:
        """`linear` against weights stacked along N, split along the last axis into parts of
        `widths` (summing to N) -> one `[..., widths[i]]` array per part (contiguous where
        native's kernel runs)."""
        ...

    def add_rms_norm(
        self, residual: mx.array, update: mx.array, weight: mx.array, *, eps: float
    ) -> tuple[mx.array, mx.array]:
        """residual/update `[..., H]`, weight `[H]`, one dtype (native rejects others) ->
        `(residual + update, its RMSNorm * weight)`, each `[..., H]`."""
        ...

    def norm_rope(
        self, x: mx.array, weight: mx.array, offsets: mx.array, *, eps: float, base: float
    ) -> mx.array:
        """x `[B, L, H, D]`, weight `[D]` of x's dtype (native rejects others), offsets int32
        `[B]` -> RMSNorm(x) * weight rotated by non-traditional RoPE at positions
        `offsets[b] + l`, `[B, H, L, D]` in x's dtype."""
        ...

    def decoder_layer(
        self,
        residual: mx.array,
        pending: mx.array | None,
        weights: DecoderLayerWeights,
        key_pages: mx.array,
        value_pages: mx.array,
        block_table: mx.array,
        context_lens: mx.array,
        slot_mapping: mx.array,
        offsets: mx.array,
        page_size: int,
        *,
        eps: float,
        rope_base: float,
        scale: float | None = None,
    ) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        """One pre-norm Qwen3 decoder layer over paged K/V (causal): residual and pending (the
        previous layer's MLP output, or None) `[B, L, H]`, the step's tables as for `write_kv`
        and `paged_attention`, offsets int32 `[B]` (RoPE position of each row's first token)
        -> `(h, mlp, key_pages, value_pages)`: the residual stream after attention, the MLP
        output (which the caller adds), and the pages with this step's K/V written."""
        ...


class ModuleBackend:
    """A `KernelBackend` whose ops are the module-level functions of the same names.

    Args:
        name: The registry name (`KernelBackend.name`).
        module: A module defining `paged_attention`, `write_kv`, `gather_kv`,
            `dense_attention`, `quantized_embedding`, `linear`, `split_linear`,
            `add_rms_norm`, `norm_rope` and `decoder_layer` with the protocol's signatures.

    Raises:
        AttributeError: If `module` lacks one of the ten ops.
    """

    __slots__ = (
        "add_rms_norm",
        "decoder_layer",
        "dense_attention",
        "gather_kv",
        "linear",
        "module",
        "name",
        "norm_rope",
        "paged_attention",
        "quantized_embedding",
        "split_linear",
        "write_kv",
    )

    def __init__(self, name: str, module: ModuleType) -> None:
        self.name = name
        self.module = module
        self.paged_attention = module.paged_attention
        self.write_kv = module.write_kv
        self.gather_kv = module.gather_kv
        self.dense_attention = module.dense_attention
        self.quantized_embedding = module.quantized_embedding
        self.linear = module.linear
        self.split_linear = module.split_linear
        self.add_rms_norm = module.add_rms_norm
        self.norm_rope = module.norm_rope
        self.decoder_layer = module.decoder_layer

    def __repr__(self) -> str:
        return f"ModuleBackend({self.name!r}, {self.module.__name__})"


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    """Names of the installed kernel backends, sorted."""
    return sorted(_entry_points())


def get_backend(name: str = "native") -> KernelBackend:
    """Loads the kernel backend registered under `name`.

    Args:
        name: An entry-point name of the `pagekernels.backends` group ("native", "reference",
            or one another distribution registers).

    Returns:
        The backend object.

    Raises:
        ValueError: If no installed distribution registers `name`.
    """
    entry_points = _entry_points()
    if name not in entry_points:
        available = ", ".join(sorted(entry_points)) or "none"
        raise ValueError(
            f"unknown kernel backend {name!r}; available ({ENTRY_POINT_GROUP}): {available}"
        )
    return entry_points[name].load()
