"""pagekernels: paged-attention kernels for MLX (C++/CUDA custom primitives), their readable
`mlx.core` references, and the `KernelBackend` registry.

Shape letters, used by every docstring of the package (and the C++ sources):

- B: batch rows.
- Hq: query heads; Hkv: key/value heads (`Hq % Hkv == 0`; query head h reads K/V head
  `h // (Hq // Hkv)`).
- L: query length (new tokens per row); S: dense key length; T: new tokens of a write.
- D: head dim.
- P: physical pages; ps: page size (tokens per page).

The ops (`paged_attention`, `write_kv`, `gather_kv`, `dense_attention`,
`quantized_embedding`, `linear`, `split_linear`, `add_rms_norm`, `norm_rope`,
`decoder_layer`) are the compiled kernels of `pagekernels.native`; `pagekernels.reference`
holds their readable equations and the oracle tolerances (`pagekernels.reference.TOLERANCE`).
`with_cuda` is a bool: True when this build carries the CUDA kernels (built with
`PAGEKERNELS_CUDA=1`).
"""

from importlib.metadata import PackageNotFoundError, version

import mlx.core  # noqa: F401  (first: registers mx.array with nanobind before _ext loads)

from pagekernels.backend import (  # noqa: E402
    DecoderLayerWeights,
    KernelBackend,
    ModuleBackend,
    available_backends,
    get_backend,
)
from pagekernels.native import (  # noqa: E402
    add_rms_norm,
    decoder_layer,
    dense_attention,
    gather_kv,
    linear,
    norm_rope,
    paged_attention,
    quantized_embedding,
    split_linear,
    with_cuda,
    write_kv,
)
from pagekernels.validation import validate_paged_metadata  # noqa: E402

try:
    __version__ = version("pagekernels")
except PackageNotFoundError:  # a source tree on sys.path with a hand-built _ext (no metadata)
    __version__ = "0+source"

__all__ = [
    "DecoderLayerWeights",
    "KernelBackend",
    "ModuleBackend",
    "__version__",
    "add_rms_norm",
    "available_backends",
    "decoder_layer",
    "dense_attention",
    "gather_kv",
    "get_backend",
    "linear",
    "norm_rope",
    "paged_attention",
    "quantized_embedding",
    "split_linear",
    "validate_paged_metadata",
    "with_cuda",
    "write_kv",
]
