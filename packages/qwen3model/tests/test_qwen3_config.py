"""ModelArgs: parsing Hugging Face config.json objects, validation, round trips."""

from __future__ import annotations

import pytest

from qwen3model import SYNTHETIC_CONFIGS, ModelArgs, QuantizationArgs

# Qwen/Qwen3-0.6B's config.json as published on the hub (keys Qwen3 does not use included).
QWEN3_0_6B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_real_config_parses_to_the_synthetic_shape() -> None:
    assert ModelArgs.from_dict(QWEN3_0_6B_CONFIG) == SYNTHETIC_CONFIGS["qwen3-0.6b"]


def test_to_dict_round_trips() -> None:
    args = SYNTHETIC_CONFIGS["qwen3-tiny"].with_quantization(
        QuantizationArgs(group_size=32, bits=8)
    )
    config = args.to_dict()
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["quantization"] == {"group_size": 32, "bits": 8}
    assert ModelArgs.from_dict(config) == args


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    config = {k: v for k, v in QWEN3_0_6B_CONFIG.items() if k != "head_dim"}
    assert ModelArgs.from_dict(config).head_dim == 1024 // 16


def test_mlx_community_quantization_is_read() -> None:
    config = {**QWEN3_0_6B_CONFIG, "quantization": {"group_size": 64, "bits": 4, "mode": "affine"}}
    assert ModelArgs.from_dict(config).quantization == QuantizationArgs(group_size=64, bits=4)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "llama"}, "model_type"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"use_sliding_window": True}, "sliding_window"),
        ({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}, "mode"),
        ({"quantization": {"group_size": 48, "bits": 4}}, "group_size"),
        ({"quantization": {"group_size": 64, "bits": 4, "lm_head": False}}, "per-layer"),
        ({"vocab_size": None}, "vocab_size"),
        ({"rope_scaling": "linear"}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "disagree"),
        ({"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
        ({"rope_theta": True}, "rope_theta"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}, "quant_method"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}, "awq"),
    ],
    ids=[
        "other-architecture",
        "heads-not-grouped",
        "zero-width",
        "float-layers",
        "rope-scaling",
        "sliding-window",
        "non-affine",
        "odd-group",
        "per-layer-quantization",
        "null-vocab",
        "rope-scaling-not-an-object",
        "rope-parameters-scaled",
        "rope-theta-disagrees",
        "eps-as-string",
        "theta-as-bool",
        "tie-as-string",
        "attention-bias",
        "other-activation",
        "fp8-checkpoint",
        "awq-checkpoint",
    ],
)
def test_bad_configs_are_rejected(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelArgs.from_dict({**QWEN3_0_6B_CONFIG, **change})


def test_missing_keys_are_named() -> None:
    config = {k: v for k, v in QWEN3_0_6B_CONFIG.items() if k != "vocab_size"}
    with pytest.raises(ValueError, match="vocab_size"):
        ModelArgs.from_dict(config)


def test_transformers_5_rope_parameters_are_read() -> None:
    config = {k: v for k, v in QWEN3_0_6B_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0}
    assert ModelArgs.from_dict(config).rope_theta == 10_000.0
