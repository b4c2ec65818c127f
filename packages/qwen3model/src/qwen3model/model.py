"""`Qwen3Model`: the Qwen3 network as a `pageruntime.StepModel` (one call per scheduler step,
K/V in pages), with the gather and dense baselines selected by `AttentionMode`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from pagepool import BatchMetadata, KVStorage, PagePool
from qwen3model.attention import AttentionMode, StepAttention
from qwen3model.compiled import CompiledDecode
from qwen3model.config import ModelArgs, QuantizationArgs
from qwen3model.dense_baseline import DenseKVStore, DenseStepAttention
from qwen3model.layers import Qwen3Backbone
from qwen3model.paged import GatherStepAttention, PagedStepAttention
from qwen3model.projection import Projection, stack_checkpoint, unstack_checkpoint

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["Qwen3Model"]


class Qwen3Model(nn.Module):
    """Qwen3 for causal generation; implements `pageruntime.StepModel`.

    Parameters carry Hugging Face names, except that a layer's q/k/v projections are stacked
    into `self_attn.qkv_proj` and its gate/up projections into `mlp.gate_up_proj`; `sanitize`
    maps a checkpoint onto the model and `checkpoint_weights` maps back.

    Args:
        args: The network's shape.
        backend: Kernel backend (`pagekernels.get_backend(...)`).
        attention_mode: `PAGED` (serving path), `GATHER` or `DENSE` (baselines).
        max_seq_len: Longest request (prompt + output) to serve; defaults to
            `args.max_position_embeddings`.
        compile_decode: Run paged decode steps (`L = 1`) through `mx.compile`, one trace per
            batch-size bucket and block-table width (see `CompiledDecode`).

    Attributes:
        attention_mode: The attention path; may be reassigned between engines (the storage
            an engine makes must match the mode it then runs with).
        compile_decode: Whether paged decode steps run compiled; may be reassigned.
        copied_bytes: K/V bytes copied outside the attention kernel so far (gathers or repacks;
            0 on the paged path).
    """

    def __init__(
        self,
        args: ModelArgs,
        *,
        backend: KernelBackend,
        attention_mode: AttentionMode = AttentionMode.PAGED,
        max_seq_len: int | None = None,
        compile_decode: bool = False,
    ) -> None:
        super().__init__()
        self.args = args
        self.backend = backend
        self.attention_mode = AttentionMode(attention_mode)
        limit = args.max_position_embeddings if max_seq_len is None else max_seq_len
        if not 0 < limit <= args.max_position_embeddings:
            raise ValueError(
                f"max_seq_len={max_seq_len}, expected 1..{args.max_position_embeddings} "
                "(max_position_embeddings)"
            )
        self._max_seq_len = limit
        self.model = Qwen3Backbone(args, backend)
        if not args.tie_word_embeddings:
            self.lm_head = Projection(args.hidden_size, args.vocab_size, backend)
        self.copied_bytes = 0
        self.compile_decode = compile_decode
        self._compiled_decode = CompiledDecode(self)

    @property
    def max_seq_len(self) -> int:
        """Longest request, in tokens (prompt + output), the model serves."""
        return self._max_seq_len

    @property
    def vocab_size(self) -> int:
        """Token ids are in `[0, vocab_size)`; the width of the logits `step` returns."""
        return self.args.vocab_size

    @property
    def dtype(self) -> mx.Dtype:
        """Activation and K/V dtype (the norms' dtype; quantized layers keep float scales)."""
        return self.model.norm.weight.dtype

    def make_kv_storage(
        self, pool: PagePool, *, fill_value: float = 0.0
    ) -> KVStorage | DenseKVStore:
        """K/V storage for `pool`: page arrays per layer, or dense caches in `DENSE` mode.

        Args:
            pool: The engine's page pool.
            fill_value: Value of every slot nothing has written (tests poison with NaN).
        """
        storage_type = DenseKVStore if self.attention_mode is AttentionMode.DENSE else KVStorage
        return storage_type(
            pool,
            num_layers=self.args.num_hidden_layers,
            num_kv_heads=self.args.num_key_value_heads,
            head_dim=self.args.head_dim,
            dtype=self.dtype,
            fill_value=fill_value,
        )

    def step(
        self, tokens: mx.array, metadata: BatchMetadata, kv: KVStorage | DenseKVStore
    ) -> mx.array:
        """Runs one scheduler step: stores the new tokens' K/V and returns next-token logits.

        Builds no host synchronisation: every array comes from `metadata`, built once.

        Args:
            tokens: int32 `[B, L]`, row b's `L` new tokens (`L = metadata.query_len`).
            metadata: The step's page tables (`BatchMetadata.build`), shared by every layer.
            kv: The storage `make_kv_storage` returned; updated in place.

        Returns:
            float32 `[B, vocab]` logits of every row's last position.

        Raises:
            ValueError: `tokens` does not match `metadata`.
            TypeError: `kv` is not the kind of storage this model's attention mode uses.
        """
        B, L = metadata.batch_size, metadata.query_len
        if tokens.ndim != 2 or tuple(tokens.shape) != (B, L):
            raise ValueError(
                f"tokens has shape {tuple(tokens.shape)}, expected ({B}, {L}) [B, L] from metadata"
            )
        if self.compile_decode and L == 1 and self.attention_mode is AttentionMode.PAGED:
            _check_page_storage(self.attention_mode, kv)
            return self._compiled_decode(tokens, metadata, kv)
        attention = self._step_attention(metadata, kv)
        offsets = metadata.positions.reshape(B, L)[:, 0]
        hidden = self.model(tokens, offsets, attention)
        self.copied_bytes += attention.copied_bytes
        return self.logits(hidden)

    def logits(self, hidden: mx.array) -> mx.array:
        """Maps normed hidden states `[..., hidden]` to float32 logits `[..., vocab]`."""
        if not self.args.tie_word_embeddings:
            return self.lm_head(hidden).astype(mx.float32)
        embedding = self.model.embed_tokens
        if isinstance(embedding, nn.QuantizedEmbedding):
            return embedding.as_linear(hidden).astype(mx.float32)
        return self.backend.linear(hidden, embedding.weight).astype(mx.float32)

    def _step_attention(
        self, metadata: BatchMetadata, kv: KVStorage | DenseKVStore
    ) -> StepAttention:
        scale = self.args.head_dim**-0.5
        if self.attention_mode is AttentionMode.DENSE:
            if not isinstance(kv, DenseKVStore):
                raise TypeError(f"the dense baseline needs its DenseKVStore, got {kv!r}")
            return DenseStepAttention(self.backend, kv, metadata, scale)
        _check_page_storage(self.attention_mode, kv)
        if self.attention_mode is AttentionMode.GATHER:
            return GatherStepAttention(self.backend, kv, metadata, scale)
        return PagedStepAttention(self.backend, kv, metadata, scale)

    def quantize(self, quantization: QuantizationArgs) -> None:
        """Quantizes every linear layer and the embedding in place (MLX affine, the
        mlx-community layout) and records it in `args`, so `save_pretrained` writes it."""
        nn.quantize(self, group_size=quantization.group_size, bits=quantization.bits)
        self.args = self.args.with_quantization(quantization)
        # Traces of the float network are dead now; drop them (and MLX's graphs with them).
        self._compiled_decode.reset()

    def sanitize(self, weights: Mapping[str, mx.array]) -> dict[str, mx.array]:
        """Checkpoint weights under this model's parameter names: drops entries the model does
        not hold (a tied `lm_head`, RoPE tables) and stacks q/k/v and gate/up parts."""
        kept = {
            name: array
            for name, array in weights.items()
            if "rotary_emb.inv_freq" not in name
            and not (self.args.tie_word_embeddings and name.startswith("lm_head."))
        }
        return stack_checkpoint(kept, self)

    def checkpoint_weights(self) -> dict[str, mx.array]:
        """The parameters under Hugging Face checkpoint names (stacked projections split into
        `q_proj`, `k_proj`, ...), as `save_pretrained` writes them."""
        return unstack_checkpoint(dict(tree_flatten(self.parameters())), self)


def _check_page_storage(mode: AttentionMode, kv: KVStorage | DenseKVStore) -> None:
    # A dense cache handed to the paged model is a programming error, never a fallback.
    if not isinstance(kv, KVStorage):
        raise TypeError(f"{mode.value} attention needs page storage, got {kv!r}")
