"""Qwen3 attention: projections, per-head q/k RMSNorm, RoPE, and a per-step `StepAttention`
that stores this step's K/V and attends (paged, paged + gather, or dense without pages)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx
import mlx.nn as nn

from qwen3model.config import ModelArgs
from qwen3model.projection import Projection, StackedProjection

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["Attention", "AttentionMode", "StepAttention", "attend_dense"]


class AttentionMode(StrEnum):
    """How a model stores K/V and runs attention.

    PAGED: K/V in pages, `write_kv` + `paged_attention` (the serving path).
    GATHER: K/V in pages, `write_kv` + `gather_kv` + `dense_attention` (the dense-gather
        ablation, `--disable-paged-attention`).
    DENSE: no pages: per-request contiguous caches repacked into a dense batch every step
        and run through `dense_attention` (the "Week 2" baseline).
    """

    PAGED = "paged"
    GATHER = "gather"
    DENSE = "dense"


class StepAttention(Protocol):
    """One model call's K/V store and attention, shared by every layer.

    Built once per step from the step's metadata, so layers never re-read or re-validate it.

    Attributes:
        copied_bytes: K/V bytes this step copied outside the attention kernel (gathers,
            repacks), counted on the host from shapes.
    """

    copied_bytes: int

    def __call__(self, layer: int, queries: mx.array, keys: mx.array, values: mx.array) -> mx.array:
        """Stores layer `layer`'s new `keys`/`values` and attends to the row's whole context.

        Args:
            layer: Layer index.
            queries: `[B, Hq, L, D]`, RoPE applied.
            keys: `[B, Hkv, L, D]`, RoPE applied, the step's new keys.
            values: `[B, Hkv, L, D]`, the step's new values.

        Returns:
            `[B, Hq, L, D]` attention output (causal: query `l` sees the context up to itself).
        """
        ...


def attend_dense(
    backend: KernelBackend,
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    key_lens: mx.array,
    scale: float,
) -> mx.array:
    """Causal `dense_attention` of the step's queries over a padded dense K/V batch (the
    gather and dense baselines).

    Args:
        backend: Kernel backend.
        queries: `[B, Hq, L, D]`, the last `L` positions of every row.
        keys: `[B, Hkv, S, D]`, row b's context in its first `key_lens[b]` positions.
        values: `[B, Hkv, S, D]`, laid out like `keys`.
        key_lens: int32 `[B]`, every row's context length (0 for a padding row).
        scale: Softmax scale.

    Returns:
        `[B, Hq, L, D]`; query `l` of row b sees the keys up to position `key_lens[b] - L + l`.
    """
    return backend.dense_attention(
        queries, keys, values, scale=scale, mask="causal", key_lens=key_lens
    )


class Attention(nn.Module):
    """Grouped-query attention with q/k RMSNorm per head before RoPE (Qwen3).

    Args:
        args: The network's shape.
        layer_index: This layer's index (selects its K/V in the step's store).
        backend: Kernel backend of the projections.
    """

    def __init__(self, args: ModelArgs, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.backend = backend
        self.layer_index = layer_index
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.head_dim = args.head_dim
        self.rope_theta = args.rope_theta
        hidden, D = args.hidden_size, args.head_dim
        # q_proj, k_proj and v_proj of the checkpoint, stacked: one product per step.
        self.qkv_proj = StackedProjection(
            hidden,
            {
                "q_proj": self.n_heads * D,
                "k_proj": self.n_kv_heads * D,
                "v_proj": self.n_kv_heads * D,
            },
            backend,
        )
        self.o_proj = Projection(self.n_heads * D, hidden, backend)
        self.q_norm = nn.RMSNorm(D, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(D, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, offsets: mx.array, attention: StepAttention) -> mx.array:
        """Attends `x` `[B, L, hidden]`; `offsets` int32 `[B]` holds each row's first position.

        Returns:
            `[B, L, hidden]` in the weights' dtype.
        """
        B, L, _ = x.shape
        D = self.head_dim
        queries, keys, values = self.qkv_proj(x)
        # q_norm/k_norm and RoPE in one kernel each; both come back heads-first [B, H, L, D].
        queries = self._norm_rope(queries.reshape(B, L, self.n_heads, D), self.q_norm, offsets)
        keys = self._norm_rope(keys.reshape(B, L, self.n_kv_heads, D), self.k_norm, offsets)
        values = values.reshape(B, L, self.n_kv_heads, D).transpose(0, 2, 1, 3)
        output = attention(self.layer_index, queries, keys, values)
        return self.o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, self.n_heads * D))

    def _norm_rope(self, x: mx.array, norm: nn.RMSNorm, offsets: mx.array) -> mx.array:
        # Qwen3 rotates the two halves of each head (non-traditional RoPE), as Hugging Face does.
        return self.backend.norm_rope(x, norm.weight, offsets, eps=norm.eps, base=self.rope_theta)
