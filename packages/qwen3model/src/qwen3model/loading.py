"""`load_model`: a Hugging Face directory, a hub id or a `synthetic:` name -> model + tokenizer;
`save_pretrained`: any model -> a Hugging Face-format directory."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import mlx.core as mx
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

from pagekernels import KernelBackend, get_backend
from qwen3model.attention import AttentionMode
from qwen3model.config import ModelArgs
from qwen3model.model import Qwen3Model
from qwen3model.synthetic import SYNTHETIC_CONFIGS, SYNTHETIC_PREFIX, build_synthetic
from qwen3model.synthetic import synthetic_name as parse_synthetic
from qwen3model.tokenizer import Tokenizer
from qwen3model.weights import apply_weights, read_safetensors, write_safetensors

__all__ = ["DTYPES", "ModelNotFoundError", "default_dtype", "load_model", "save_pretrained"]

DTYPES: dict[str, mx.Dtype] = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
}
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class ModelNotFoundError(FileNotFoundError):
    """No model at the given path, not in the hub cache, or the hub cannot be reached."""


def default_dtype() -> mx.Dtype:
    """bfloat16 when the default device is a GPU, float32 on CPU (fast there, exact in tests)."""
    return mx.bfloat16 if mx.default_device() == mx.gpu else mx.float32


def load_model(
    source: str,
    *,
    kernel_backend: str | KernelBackend = "native",
    attention_mode: AttentionMode | str = AttentionMode.PAGED,
    dtype: mx.Dtype | None = None,
    seed: int = 0,
    max_seq_len: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[Qwen3Model, Tokenizer]:
    """Loads a Qwen3 model and its tokenizer.

    Args:
        source: `synthetic:<name>` (see `SYNTHETIC_CONFIGS`), a directory holding
            `config.json`, `*.safetensors` and `tokenizer.json`, or a hub id (`Qwen/Qwen3-0.6B`,
            `mlx-community/Qwen3-0.6B-4bit`) downloaded through `huggingface_hub`.
        kernel_backend: A backend name (`native`, `reference`) or a backend object.
        attention_mode: `paged`, `gather` or `dense`.
        dtype: Float weight dtype; None keeps a checkpoint's dtype, and gives synthetic
            models `default_dtype()`.
        seed: Weight seed of synthetic models.
        max_seq_len: Longest request to serve (default: the config's limit).
        on_progress: Progress callback `(done, total)` while synthetic weights are made.

    Raises:
        ModelNotFoundError: Nothing found; the message names every place looked at.
        ValueError: Unknown synthetic name, bad config or weights that do not fit the config.
    """
    backend = get_backend(kernel_backend) if isinstance(kernel_backend, str) else kernel_backend
    mode = AttentionMode(attention_mode)
    name = parse_synthetic(source)
    if name is not None:
        return build_synthetic(
            name,
            backend=backend,
            dtype=default_dtype() if dtype is None else dtype,
            seed=seed,
            attention_mode=mode,
            max_seq_len=max_seq_len,
            on_progress=on_progress,
        )
    directory = resolve_checkpoint(source)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(f"no config.json in {directory} (expected a Hugging Face model)")
    args = ModelArgs.from_dict(json.loads(config_path.read_text()))
    model = Qwen3Model(args, backend=backend, attention_mode=mode, max_seq_len=max_seq_len)
    weights = model.sanitize(read_safetensors(directory))
    apply_weights(model, weights, quantization=args.quantization, dtype=dtype)
    return model, Tokenizer.from_directory(directory)


def resolve_checkpoint(source: str) -> Path:
    """The local directory of `source`: the path itself, or the hub snapshot of a hub id.

    Raises:
        ModelNotFoundError: Neither a directory nor a hub id that can be fetched.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    local = path.resolve()
    if path.exists() or not _HUB_ID.match(source):
        known = ", ".join(SYNTHETIC_PREFIX + name for name in SYNTHETIC_CONFIGS)
        raise ModelNotFoundError(
            f"no model directory at {local}; expected a Hugging Face model directory, "
            f"a hub id such as Qwen/Qwen3-0.6B, or one of {known}"
        )
    try:
        snapshot = huggingface_hub.snapshot_download(repo_id=source, allow_patterns=_HUB_FILES)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as error:
        raise ModelNotFoundError(
            f"model {source!r} not found: no directory at {local}, and the Hugging Face hub "
            f"(cache {hub_constants.HF_HUB_CACHE}) could not provide it: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    return Path(snapshot)


def save_pretrained(
    model: Qwen3Model,
    tokenizer: Tokenizer,
    directory: str | Path,
    *,
    max_shard_bytes: int | None = None,
) -> list[Path]:
    """Writes `model` and `tokenizer` as a Hugging Face-format directory that `load_model`
    (and mlx-lm) can read: `config.json`, safetensors (sharded with an index past
    `max_shard_bytes`), `tokenizer.json`, `tokenizer_config.json`.

    Returns:
        The weight files written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.args.to_dict()
    config["torch_dtype"] = next(name for name, dt in DTYPES.items() if dt == model.dtype)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    written = write_safetensors(
        model.checkpoint_weights(), directory, max_shard_bytes=max_shard_bytes
    )
    tokenizer.save(directory)
    return written
