"""Synthetic Qwen3 models: real configurations' shapes with seeded random weights, built in
memory without downloads, paired with the byte-level tokenizer. Their text is meaningless;
they exist to run and measure the engine anywhere."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx
from mlx.utils import tree_flatten

from qwen3model.attention import AttentionMode
from qwen3model.config import ModelArgs
from qwen3model.model import Qwen3Model
from qwen3model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pagekernels import KernelBackend

__all__ = ["SYNTHETIC_CONFIGS", "SYNTHETIC_PREFIX", "build_synthetic", "synthetic_name"]

SYNTHETIC_PREFIX = "synthetic:"
_QWEN3_VOCAB = 151936
_BYTE_VOCAB = Tokenizer.byte_level().vocab_size

SYNTHETIC_CONFIGS: dict[str, ModelArgs] = {
    # Shapes of the Hugging Face Qwen/Qwen3-0.6B and Qwen/Qwen3-4B config.json files.
    "qwen3-0.6b": ModelArgs(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=_QWEN3_VOCAB,
    ),
    "qwen3-4b": ModelArgs(
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        vocab_size=_QWEN3_VOCAB,
    ),
    # The serve-bench default on CPU: Qwen3's head_dim (the kernels' specialised path) in a few
    # layers, and the byte vocabulary so the LM head does not dwarf attention.
    "qwen3-small": ModelArgs(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=768,
        vocab_size=_BYTE_VOCAB,
    ),
    # For tests: every id is a byte-tokenizer id; head_dim 64, the smallest the fused CUDA
    # kernels (norm_rope, tensor-core attention) take, so GPU runs of the suite exercise them.
    "qwen3-tiny": ModelArgs(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=128,
        vocab_size=_BYTE_VOCAB,
        max_position_embeddings=4096,
    ),
}

_EMBEDDING_STD = 0.02


def synthetic_name(source: str) -> str | None:
    """The configuration name in `synthetic:<name>`, or None if `source` is not synthetic."""
    return source.removeprefix(SYNTHETIC_PREFIX) if source.startswith(SYNTHETIC_PREFIX) else None


def build_synthetic(
    name: str,
    *,
    backend: KernelBackend,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
    attention_mode: AttentionMode = AttentionMode.PAGED,
    max_seq_len: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[Qwen3Model, Tokenizer]:
    """Builds a synthetic model with deterministic random weights and the byte tokenizer.

    Weights are normal, drawn in float32 from a key derived from `seed` and the parameter's
    name, then cast to `dtype`: the embedding (and an untied LM head) with std 0.02 (Hugging
    Face's `initializer_range`), projections with std `fan_in ** -0.5`; norm weights are 1.
    The same seed gives the same weights in every dtype (up to rounding). Weights are made
    block by block, so no copy of the whole model is ever held twice.

    Args:
        name: A key of `SYNTHETIC_CONFIGS` (without the `synthetic:` prefix).
        backend: Kernel backend.
        dtype: Weight and K/V dtype.
        seed: Weight seed.
        attention_mode: Attention path (see `AttentionMode`).
        max_seq_len: Longest request to serve (default: the config's limit).
        on_progress: Called as `on_progress(done, total)` after each block of weights.

    Raises:
        ValueError: Unknown name (the message lists the known ones).
    """
    if name not in SYNTHETIC_CONFIGS:
        known = ", ".join(SYNTHETIC_PREFIX + known for known in SYNTHETIC_CONFIGS)
        raise ValueError(f"unknown synthetic model {name!r}; known: {known}")
    args = SYNTHETIC_CONFIGS[name]
    model = Qwen3Model(
        args, backend=backend, attention_mode=attention_mode, max_seq_len=max_seq_len
    )
    blocks = [("model.embed_tokens", model.model.embed_tokens)]
    blocks += [(f"model.layers.{i}", layer) for i, layer in enumerate(model.model.layers)]
    blocks.append(("model.norm", model.model.norm))
    if not args.tie_word_embeddings:
        blocks.append(("lm_head", model.lm_head))
    for done, (prefix, module) in enumerate(blocks, start=1):
        weights = {
            f"{prefix}.{path}": _random_weight(f"{prefix}.{path}", array.shape, dtype, seed)
            for path, array in tree_flatten(module.parameters())
        }
        model.load_weights(list(weights.items()), strict=False)
        mx.eval(list(weights.values()))
        if on_progress is not None:
            on_progress(done, len(blocks))
    return model, Tokenizer.byte_level()


def _random_weight(name: str, shape: tuple[int, ...], dtype: mx.Dtype, seed: int) -> mx.array:
    if name.endswith("norm.weight"):
        return mx.ones(shape, dtype=dtype)
    # Projections keep unit-variance activations (std fan_in ** -0.5), so every layer matters
    # and greedy text varies; with 0.02 everywhere a tied model just repeats its input token.
    std = _EMBEDDING_STD if "embed_tokens" in name or "lm_head" in name else shape[-1] ** -0.5
    key = mx.random.key(zlib.crc32(f"{seed}:{name}".encode()))
    return (mx.random.normal(shape, dtype=mx.float32, key=key) * std).astype(dtype)
