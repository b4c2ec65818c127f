"""Weights in safetensors files: read (single file or a sharded index), write (optionally
sharded), put into a model (quantizing the layers the checkpoint quantized), and quantize."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from qwen3model.config import QuantizationArgs

__all__ = [
    "SAFETENSORS_INDEX",
    "apply_weights",
    "read_safetensors",
    "write_safetensors",
]

SAFETENSORS_INDEX = "model.safetensors.index.json"
_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def read_safetensors(directory: str | Path) -> dict[str, mx.array]:
    """Loads every tensor of a Hugging Face checkpoint directory (lazily, as MLX does).

    Uses `model.safetensors.index.json` when present (its `weight_map` names the shards),
    otherwise every `*.safetensors` file. Never unpickles anything.

    Raises:
        FileNotFoundError: No safetensors file, or a shard named by the index is missing.
        ValueError: Two files hold the same tensor name.
    """
    directory = Path(directory)
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({directory / name for name in weight_map.values()})
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names missing shard(s): {missing}")
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    weights: dict[str, mx.array] = {}
    for path in files:
        shard = mx.load(str(path), format="safetensors")
        duplicated = sorted(weights.keys() & shard.keys())
        if duplicated:
            raise ValueError(f"{path} repeats tensors found in another file: {duplicated[:5]}")
        weights.update(shard)
    return weights


def write_safetensors(
    weights: Mapping[str, mx.array], directory: str | Path, *, max_shard_bytes: int | None = None
) -> list[Path]:
    """Writes `weights` as `model.safetensors`, or as shards plus an index when they exceed
    `max_shard_bytes` (Hugging Face naming: `model-00001-of-00003.safetensors`).

    Weight files of an earlier save in `directory` (`model.safetensors`, shards, the index) are
    removed first: `read_safetensors` would otherwise read a stale index.

    Returns:
        The files written (shards first, then the index if any).
    """
    directory = Path(directory)
    for stale in (
        directory / "model.safetensors",
        directory / SAFETENSORS_INDEX,
        *directory.glob("model-*-of-*.safetensors"),
    ):
        stale.unlink(missing_ok=True)
    shards: list[dict[str, mx.array]] = [{}]
    shard_bytes = 0
    for name in sorted(weights):
        array = weights[name]
        if (
            max_shard_bytes is not None
            and shards[-1]
            and shard_bytes + array.nbytes > max_shard_bytes
        ):
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = array
        shard_bytes += array.nbytes
    metadata = {"format": "mlx"}
    if len(shards) == 1:
        path = directory / "model.safetensors"
        mx.save_safetensors(str(path), shards[0], metadata=metadata)
        return [path]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        path = directory / f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(path), shard, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, path.name))
        written.append(path)
    total = sum(array.nbytes for array in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return [*written, directory / SAFETENSORS_INDEX]


def apply_weights(
    model: nn.Module,
    weights: Mapping[str, mx.array],
    *,
    quantization: QuantizationArgs | None = None,
    dtype: mx.Dtype | None = None,
) -> None:
    """Loads `weights` into `model` (every parameter must be present, nothing extra).

    Args:
        model: A freshly built model with Hugging Face parameter names.
        weights: Name -> array, already sanitized.
        quantization: When set, layers whose `{name}.scales` is present are quantized first.
        dtype: Casts floating-point weights (not quantized integers) to this dtype.

    Raises:
        ValueError: A parameter is missing, unexpected, or has the wrong shape; a float
            parameter is stored as integers (or the reverse); or, without `dtype`, the float
            weights mix dtypes (the kernels take one).
    """
    if quantization is not None:
        nn.quantize(
            model,
            group_size=quantization.group_size,
            bits=quantization.bits,
            class_predicate=lambda path, module: f"{path}.scales" in weights,
        )
    if dtype is not None:
        weights = {
            name: array.astype(dtype) if array.dtype in _FLOAT_DTYPES else array
            for name, array in weights.items()
        }
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing[:5]} "
            f"({len(missing)} in all), unexpected {unexpected[:5]} ({len(unexpected)} in all)"
        )
    wrong_kind = [
        f"{name} ({_dtype_name(weights[name].dtype)}, expected {_dtype_name(param.dtype)})"
        for name, param in expected.items()
        if (param.dtype in _FLOAT_DTYPES) != (weights[name].dtype in _FLOAT_DTYPES)
    ]
    if wrong_kind:
        raise ValueError(f"checkpoint tensors of the wrong kind: {wrong_kind[:5]}")
    float_dtypes = sorted(
        {_dtype_name(array.dtype) for array in weights.values() if array.dtype in _FLOAT_DTYPES}
    )
    if len(float_dtypes) > 1:
        raise ValueError(
            f"checkpoint mixes float dtypes {float_dtypes}; load it with one dtype "
            "(load_model(dtype=...), --dtype on the command line)"
        )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")
