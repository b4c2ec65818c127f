"""The Qwen3 blocks around attention: SwiGLU MLP, the transformer block, and the backbone
(embedding, blocks, final norm), with Hugging Face parameter names except the stacked
`mlp.gate_up_proj` (see `qwen3model.projection`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from pagekernels import DecoderLayerWeights
from qwen3model.attention import Attention, StepAttention
from qwen3model.config import ModelArgs
from qwen3model.paged import PagedStepAttention
from qwen3model.projection import Projection, StackedProjection

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["MLP", "Qwen3Backbone", "TransformerBlock"]


class MLP(nn.Module):
    """SwiGLU: `down_proj(silu(gate_proj(x)) * up_proj(x))`, no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int, backend: KernelBackend) -> None:
        super().__init__()
        # gate_proj and up_proj of the checkpoint, stacked: one product per step.
        self.gate_up_proj = StackedProjection(
            hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size}, backend
        )
        self.down_proj = Projection(intermediate_size, hidden_size, backend)

    def __call__(self, x: mx.array) -> mx.array:
        """Maps `[..., hidden]` to `[..., hidden]` in the weights' dtype."""
        gate, up = self.gate_up_proj(x)
        return self.down_proj(nn.silu(gate) * up)


class TransformerBlock(nn.Module):
    """Pre-norm block: `h = x + attn(norm(x))`, then `h + mlp(norm(h))`.

    Each residual add runs fused with the norm that follows it (`backend.add_rms_norm`), so
    the MLP's output is added by the next block (or the final norm): a block takes the residual
    stream and the previous block's pending MLP output, and returns its own pair. Over pages
    (`PagedStepAttention`) an unquantized block is one `backend.decoder_layer` call; the
    gather and dense baselines and quantized blocks run the separate ops below.
    """

    def __init__(self, args: ModelArgs, layer_index: int, backend: KernelBackend) -> None:
        super().__init__()
        self.backend = backend
        self.self_attn = Attention(args, layer_index, backend)
        self.mlp = MLP(args.hidden_size, args.intermediate_size, backend)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(
        self, x: mx.array, pending: mx.array | None, offsets: mx.array, attention: StepAttention
    ) -> tuple[mx.array, mx.array]:
        """Runs the block on the residual stream `x` `[B, L, hidden]` plus `pending` (the
        previous block's MLP output, None for the first block); `offsets` int32 `[B]` is each
        row's first position; `attention` stores and attends K/V for this step.

        Returns:
            `(h, mlp_output)`, each `[B, L, hidden]`: the stream after attention and this
            block's MLP output, which the caller adds.
        """
        if isinstance(attention, PagedStepAttention):
            weights = self.decoder_layer_weights()
            if weights is not None:
                # The whole layer in one backend op (one graph node for a GPU decode step).
                attn = self["self_attn"]
                return attention.decoder_layer(
                    attn.layer_index,
                    x,
                    pending,
                    weights,
                    offsets,
                    eps=self["input_layernorm"].eps,
                    rope_base=attn.rope_theta,
                )
        x, normed = _add_norm(self.backend, x, pending, self.input_layernorm)
        attended = self.self_attn(normed, offsets, attention)
        h, normed = _add_norm(self.backend, x, attended, self.post_attention_layernorm)
        return h, self.mlp(normed)

    def decoder_layer_weights(self) -> DecoderLayerWeights | None:
        """This block's weights for `backend.decoder_layer`; None once its projections are
        quantized (the separate ops run quantized matmuls)."""
        # Item access throughout: an `nn.Module` attribute goes through a Python `__getattr__`
        # (~0.8 us on the CPU dev machine), and this runs per layer of every uncompiled step:
        # 19 -> 1.5 us a call, ~0.6 ms per Qwen3-4B step.
        attn, mlp = self["self_attn"], self["mlp"]
        qkv, o = attn["qkv_proj"], attn["o_proj"]
        gate_up, down = mlp["gate_up_proj"], mlp["down_proj"]
        if not all(isinstance(p, Projection) for p in (qkv, o, gate_up, down)):
            return None
        return DecoderLayerWeights(
            input_layernorm=self["input_layernorm"]["weight"],
            qkv_proj=qkv["weight"],
            q_norm=attn["q_norm"]["weight"],
            k_norm=attn["k_norm"]["weight"],
            o_proj=o["weight"],
            post_attention_layernorm=self["post_attention_layernorm"]["weight"],
            gate_up_proj=gate_up["weight"],
            down_proj=down["weight"],
        )


def _add_norm(
    backend: KernelBackend, x: mx.array, pending: mx.array | None, norm: nn.RMSNorm
) -> tuple[mx.array, mx.array]:
    """`(x + pending, norm(x + pending))` in one kernel; `(x, norm(x))` when nothing is pending."""
    if pending is None:
        return x, norm(x)
    return backend.add_rms_norm(x, pending, norm.weight, eps=norm.eps)


class Qwen3Backbone(nn.Module):
    """Token embedding, the transformer blocks and the final norm (`model.*` in checkpoints).

    Args:
        args: The network's shape.
        backend: Kernel backend: the blocks' projections and attention, and quantized
            embedding lookups.
    """

    def __init__(self, args: ModelArgs, backend: KernelBackend) -> None:
        super().__init__()
        self.backend = backend
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args, i, backend) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def embed(self, tokens: mx.array) -> mx.array:
        """Looks up int32 `tokens` `[B, L]`; returns `[B, L, hidden]`."""
        embedding = self.embed_tokens
        if isinstance(embedding, nn.QuantizedEmbedding):
            return self.backend.quantized_embedding(
                tokens,
                embedding.weight,
                embedding.scales,
                embedding.biases,
                group_size=embedding.group_size,
                bits=embedding.bits,
            )
        return embedding(tokens)

    def __call__(self, tokens: mx.array, offsets: mx.array, attention: StepAttention) -> mx.array:
        """Runs every block on int32 `tokens` `[B, L]`; returns normed hidden states
        `[B, hidden]` of each row's last position."""
        h, pending = self.embed(tokens), None
        for layer in self.layers:
            h, pending = layer(h, pending, offsets, attention)
        last = None if pending is None else pending[:, -1, :]
        return _add_norm(self.backend, h[:, -1, :], last, self.norm)[1]
