"""pagekernels: paged-attention kernels for MLX (C++/CUDA custom primitives), their readable
`mlx.core` references, and the `KernelBackend` registry."""

from importlib.metadata import PackageNotFoundError, version

import mlx.core  # noqa: F401  (first: registers mx.array with nanobind before _ext loads)

from pagekernels.backend import KernelBackend, available_backends, get_backend  # noqa: E402
from pagekernels.native import (  # noqa: E402
    dense_attention,
    gather_kv,
    paged_attention,
    quantized_embedding,
    with_cuda,
    write_kv,
)
from pagekernels.validation import validate_paged_metadata  # noqa: E402

try:
    __version__ = version("pagekernels")
except PackageNotFoundError:  # a source tree on sys.path with a hand-built _ext (no metadata)
    __version__ = "0+source"

__all__ = [
    "KernelBackend",
    "available_backends",
    "dense_attention",
    "gather_kv",
    "get_backend",
    "paged_attention",
    "quantized_embedding",
    "validate_paged_metadata",
    "with_cuda",
    "write_kv",
]
