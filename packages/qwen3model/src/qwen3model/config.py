"""`ModelArgs`: the Qwen3 hyper-parameters of a Hugging Face `config.json` (read and written)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelArgs", "QuantizationArgs"]

_SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantizationArgs:
    """MLX affine quantization of a checkpoint (the mlx-community layout).

    Attributes:
        group_size: Elements sharing one scale and bias (32, 64 or 128).
        bits: Bits per weight element.
    """

    group_size: int = 64
    bits: int = 4

    def __post_init__(self) -> None:
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"quantization group_size={self.group_size}, expected 32, 64 or 128")
        if self.bits not in _SUPPORTED_BITS:
            raise ValueError(f"quantization bits={self.bits}, expected one of {_SUPPORTED_BITS}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArgs:
    """The shape of a Qwen3 network, named as in Hugging Face's `config.json`.

    Attributes:
        hidden_size: Width of the residual stream.
        num_hidden_layers: Number of transformer blocks.
        num_attention_heads: Query heads `Hq`.
        num_key_value_heads: Key/value heads `Hkv` (`Hq` must be a multiple).
        head_dim: Width `D` of one head (Qwen3 sets it explicitly: 128).
        intermediate_size: Width of the SwiGLU MLP.
        vocab_size: Rows of the embedding and the LM head.
        rms_norm_eps: Epsilon of every RMSNorm.
        rope_theta: RoPE base frequency.
        max_position_embeddings: Longest sequence the model supports.
        tie_word_embeddings: Whether the LM head reuses the embedding matrix.
        quantization: MLX quantization of the stored weights, or None for float weights.
        model_type: Always "qwen3".
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = True
    quantization: QuantizationArgs | None = None
    model_type: str = "qwen3"

    def __post_init__(self) -> None:
        if self.model_type != "qwen3":
            raise ValueError(f"model_type={self.model_type!r}, expected 'qwen3'")
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r}, expected a positive int")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}, expected an even number (RoPE pairs)")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name}={value!r}, expected a positive number")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(
                f"tie_word_embeddings={self.tie_word_embeddings!r}, expected true or false"
            )

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ModelArgs:
        """Builds the arguments from a parsed `config.json`, ignoring keys Qwen3 does not use.

        Args:
            config: The JSON object. `head_dim` defaults to `hidden_size // num_attention_heads`;
                `quantization` (or `quantization_config`) holds MLX's `group_size` and `bits`.
                RoPE settings are read from `rope_theta` / `rope_scaling` or from
                `rope_parameters` (transformers 5).

        Raises:
            ValueError: A required key is missing, a value is out of range or of the wrong
                type, or the config asks for a feature this implementation does not have (RoPE
                scaling, sliding window, attention biases, another activation, quantization
                other than MLX's affine).
        """
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        values = dict(config)
        if "head_dim" not in values and "hidden_size" in values and "num_attention_heads" in values:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(f"config.json lacks required key(s) {missing}")
        for key in ("rope_scaling", "rope_parameters"):
            rope = values.get(key)
            if rope is None:
                continue
            if not isinstance(rope, Mapping):
                raise ValueError(f"{key}={rope!r}, expected an object or null")
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                raise ValueError(f"{key}={dict(rope)!r} is not supported (only unscaled RoPE)")
            if key == "rope_parameters" and "rope_theta" in rope:
                theta = values.setdefault("rope_theta", rope["rope_theta"])
                if theta != rope["rope_theta"]:
                    raise ValueError(
                        f"rope_theta={theta!r} and rope_parameters.rope_theta="
                        f"{rope['rope_theta']!r} disagree"
                    )
        if values.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported (full attention only)")
        if values.get("attention_bias"):
            raise ValueError("attention_bias=true is not supported (Qwen3 has no attention bias)")
        if values.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={values['hidden_act']!r}, expected 'silu'")
        quantization = values.get("quantization") or values.get("quantization_config")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known and k != "quantization"}
        if quantization is not None:
            if not isinstance(quantization, Mapping):
                raise ValueError(f"quantization={quantization!r}, expected an object")
            if "quant_method" in quantization:
                raise ValueError(
                    f"quant_method={quantization['quant_method']!r} is not supported: only "
                    "MLX's affine quantization (group_size, bits) is"
                )
            if quantization.get("mode", "affine") != "affine":
                raise ValueError(f"quantization mode {quantization['mode']!r}, expected 'affine'")
            per_layer = sorted(k for k, v in quantization.items() if isinstance(v, dict | bool))
            if per_layer:
                raise ValueError(f"per-layer quantization overrides are not supported: {per_layer}")
            kwargs["quantization"] = QuantizationArgs(
                group_size=quantization.get("group_size", 64), bits=quantization.get("bits", 4)
            )
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Returns a Hugging Face style `config.json` object (round-trips through `from_dict`)."""
        config: dict[str, Any] = {"architectures": ["Qwen3ForCausalLM"]}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "quantization":
                if value is not None:
                    config["quantization"] = {"group_size": value.group_size, "bits": value.bits}
            else:
                config[field.name] = value
        return config

    def with_quantization(self, quantization: QuantizationArgs | None) -> ModelArgs:
        """Returns a copy with a different quantization (None: float weights)."""
        return dataclasses.replace(self, quantization=quantization)
