"""Qwen3 on the paged runtime: model, weight loading, synthetic models and the command line."""

from importlib.metadata import version

from qwen3model.attention import AttentionMode, StepAttention
from qwen3model.config import ModelArgs, QuantizationArgs
from qwen3model.dense_baseline import DenseKVStore
from qwen3model.loading import ModelNotFoundError, default_dtype, load_model, save_pretrained
from qwen3model.model import Qwen3Model
from qwen3model.provenance import collect_provenance
from qwen3model.synthetic import SYNTHETIC_CONFIGS, build_synthetic
from qwen3model.tokenizer import StreamDecoder, Tokenizer

__version__ = version("qwen3model")

__all__ = [
    "SYNTHETIC_CONFIGS",
    "AttentionMode",
    "DenseKVStore",
    "ModelArgs",
    "ModelNotFoundError",
    "QuantizationArgs",
    "Qwen3Model",
    "StepAttention",
    "StreamDecoder",
    "Tokenizer",
    "__version__",
    "build_synthetic",
    "collect_provenance",
    "default_dtype",
    "load_model",
    "save_pretrained",
]
