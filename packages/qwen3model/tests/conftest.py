"""Shared fixtures: kernel backends, tiny synthetic models, a one-call prefill helper and the
NumPy Qwen3 the model is checked against."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np
import pytest

from pagekernels import KernelBackend, get_backend
from pagepool import BatchMetadata, PageList, PagePool
from qwen3model import ModelArgs, Qwen3Model, Tokenizer, build_synthetic

PrefillFn = Callable[[Qwen3Model, Sequence[int]], mx.array]
NumpyQwen3Fn = Callable[[Mapping[str, np.ndarray], Sequence[int], ModelArgs], np.ndarray]


def numpy_qwen3_logits(
    weights: Mapping[str, np.ndarray], tokens: Sequence[int], args: ModelArgs
) -> np.ndarray:
    """Hugging Face's Qwen3 forward written out in float64 numpy; logits `[L, vocab]` of every
    position. `weights` are checkpoint tensors by Hugging Face name; the LM head is
    `lm_head.weight`, or the embedding where the checkpoint has none (tied)."""
    w = {name: np.asarray(array, dtype=np.float64) for name, array in weights.items()}
    eps, D = args.rms_norm_eps, args.head_dim
    Hq, Hkv, L = args.num_attention_heads, args.num_key_value_heads, len(tokens)

    def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    inv_freq = args.rope_theta ** (-np.arange(0, D, 2) / D)
    angles = np.arange(L)[:, None] * inv_freq[None, :]  # [L, D/2]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))

    def rope(x: np.ndarray) -> np.ndarray:  # x [H, L, D]; rotate_half as in transformers
        rotated = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
        return x * cos + rotated * sin

    h = w["model.embed_tokens.weight"][list(tokens)]
    for i in range(args.num_hidden_layers):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(L, Hq, D)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(L, Hkv, D)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(L, Hkv, D).transpose(1, 0, 2)
        q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"]).transpose(1, 0, 2))
        k = rope(rms_norm(k, w[p + "self_attn.k_norm.weight"]).transpose(1, 0, 2))
        k, v = np.repeat(k, Hq // Hkv, 0), np.repeat(v, Hq // Hkv, 0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(D)
        scores = np.where(np.tril(np.ones((L, L), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(L, Hq * D)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms_norm(h, w["model.norm.weight"]) @ head.T


@pytest.fixture(scope="session")
def numpy_qwen3() -> NumpyQwen3Fn:
    """`numpy_qwen3_logits`: the independent oracle of the model tests."""
    return numpy_qwen3_logits


@pytest.fixture(scope="session")
def backend() -> KernelBackend:
    """The shipped kernels (the native extension)."""
    return get_backend("native")


@pytest.fixture
def tiny(backend: KernelBackend) -> tuple[Qwen3Model, Tokenizer]:
    """A float32 `synthetic:qwen3-tiny` on the paged path."""
    return build_synthetic("qwen3-tiny", backend=backend, dtype=mx.float32, seed=0)


@pytest.fixture
def prefill() -> PrefillFn:
    """Runs a prompt through `model.step` in one call; returns float32 logits `[vocab]`."""

    def run(model: Qwen3Model, prompt_ids: Sequence[int], page_size: int = 4) -> mx.array:
        pool = PagePool(page_size, -(-len(prompt_ids) // page_size) + 1)
        kv = model.make_kv_storage(pool)
        pages = PageList(pool)
        pages.append(len(prompt_ids))
        metadata = BatchMetadata.build([pages], query_len=len(prompt_ids))
        tokens = mx.array([list(prompt_ids)], dtype=mx.int32)
        logits = model.step(tokens, metadata, kv)
        mx.eval(logits)
        return logits[0]

    return run
