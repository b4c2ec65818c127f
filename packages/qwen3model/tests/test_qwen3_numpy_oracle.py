"""The whole model against an independent float64 NumPy Qwen3, on a checkpoint whose settings
are all off their defaults: random norm weights, an untied LM head, RoPE base 1e4, RMSNorm
epsilon 1e-3, 4 query heads per K/V head and a head width other than hidden / heads. A model
that ignored any of them (a norm weight, the head, theta, epsilon) would be far outside the
tolerance; every backend and attention mode must match."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from pagepool import BatchMetadata, PageList, PagePool
from qwen3model import ModelArgs, Tokenizer, load_model

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 2, 64, 8, 2, 32, 96, 259
EPS, THETA = 1e-3, 1e4
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "intermediate_size": MLP,
    "vocab_size": VOCAB,
    "rms_norm_eps": EPS,
    "rope_theta": THETA,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "rope_scaling": None,
}
# The oracle's own arguments, built here rather than parsed from CONFIG as the model does.
ORACLE_ARGS = ModelArgs(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    intermediate_size=MLP,
    vocab_size=VOCAB,
    rms_norm_eps=EPS,
    rope_theta=THETA,
    tie_word_embeddings=False,
)
PROMPT = list(b"The quick brown fox jumps over the lazy dog, again and again.")


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, cols**-0.5, (rows, cols))

    def norm(width: int) -> np.ndarray:
        return rng.uniform(0.5, 1.5, width)

    weights = {
        "model.embed_tokens.weight": rng.normal(0.0, 0.5, (VOCAB, HIDDEN)),
        "lm_head.weight": rng.normal(0.0, 0.2, (VOCAB, HIDDEN)),
        "model.norm.weight": norm(HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": norm(HIDDEN),
            p + "post_attention_layernorm.weight": norm(HIDDEN),
            p + "self_attn.q_norm.weight": norm(HEAD_DIM),
            p + "self_attn.k_norm.weight": norm(HEAD_DIM),
            p + "self_attn.q_proj.weight": matrix(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": matrix(HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": matrix(MLP, HIDDEN),
            p + "mlp.up_proj.weight": matrix(MLP, HIDDEN),
            p + "mlp.down_proj.weight": matrix(HIDDEN, MLP),
        }
    return weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, numpy_qwen3) -> tuple[Path, np.ndarray]:
    """A Hugging Face directory with the weights (float32), and the oracle's logits."""
    weights = make_weights()
    directory = tmp_path_factory.mktemp("qwen3-off-defaults")
    (directory / "config.json").write_text(json.dumps(CONFIG))
    mx.save_safetensors(
        str(directory / "model.safetensors"),
        {name: mx.array(array.astype(np.float32)) for name, array in weights.items()},
    )
    Tokenizer.byte_level().save(directory)
    return directory, numpy_qwen3(weights, PROMPT, ORACLE_ARGS)


@pytest.mark.parametrize("mode", ["paged", "gather", "dense"])
@pytest.mark.parametrize("backend", ["native", "reference"])
def test_prefill_and_decode_match_numpy(checkpoint, backend: str, mode: str) -> None:
    directory, expected = checkpoint
    model, _ = load_model(str(directory), kernel_backend=backend, attention_mode=mode)
    pool = PagePool(16, 8)
    kv = model.make_kv_storage(pool)
    pages = PageList(pool)
    pages.append(len(PROMPT) - 1)
    prefill = model.step(
        mx.array([PROMPT[:-1]], dtype=mx.int32),
        BatchMetadata.build([pages], query_len=len(PROMPT) - 1),
        kv,
    )
    pages.append(1)
    decode = model.step(
        mx.array([PROMPT[-1:]], dtype=mx.int32), BatchMetadata.build([pages], query_len=1), kv
    )
    scale = np.abs(expected).max()
    for got, want in ((prefill[0], expected[-2]), (decode[0], expected[-1])):
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-5 * scale)
