// pagekernels._ext: nanobind bindings of the ops in pagekernels.h (nanobind 3.x, NB_DOMAIN mlx).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>  // StreamOrDevice is a std::variant
#include <nanobind/stl/vector.h>

#include "pagekernels.h"

#ifdef PAGEKERNELS_WITH_CUDA
#include "cuda/tuning.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() =
      "MLX custom primitives for paged attention (CPU kernels; CUDA kernels when built with "
      "PAGEKERNELS_CUDA=1).\n\n"
      "Shape letters as defined in help(pagekernels). Page storage is [P, Hkv, ps, D]; "
      "slot = page_id * ps + offset.";

#ifdef PAGEKERNELS_WITH_CUDA
  m.attr("with_cuda") = true;
  // Knobs of the CUDA attention kernels, for tests and benchmarks (csrc/cuda/tuning.h).
  m.def("set_decode_num_splits", &pagekernels::cuda::set_decode_num_splits, "n"_a,
        "Split-K chunks of the decode schedule (L <= 8): 0 = automatic.");
  m.def("decode_num_splits", &pagekernels::cuda::decode_num_splits);
  m.def("set_prefill_num_splits", &pagekernels::cuda::set_prefill_num_splits, "n"_a,
        "Split-K chunks of the prefill schedule (L > 8): 0 = automatic.");
  m.def("prefill_num_splits", &pagekernels::cuda::prefill_num_splits);
  m.def("set_decode_tensor_cores", &pagekernels::cuda::set_decode_tensor_cores, "enabled"_a,
        "Decode on tensor cores (float16/bfloat16, D = 64 or 128); False forces CUDA cores.");
  m.def("decode_tensor_cores", &pagekernels::cuda::decode_tensor_cores);
  m.def("set_prefill_kernel", &pagekernels::cuda::set_prefill_kernel, "name"_a,
        "Kernel of the 128-row prefill tiles (16-bit, D = 128): 'auto', 'mma_sync' or 'wgmma' "
        "(sm_90 only).");
  m.def("prefill_kernel", &pagekernels::cuda::prefill_kernel_name);
#else
  m.attr("with_cuda") = false;
#endif

  m.def("paged_attention", &pagekernels::paged_attention, "queries"_a, "key_pages"_a,
        "value_pages"_a, "block_table"_a, "context_lens"_a, "page_size"_a, nb::kw_only(),
        "scale"_a = nb::none(), "mask"_a = nb::none(), "stream"_a = nb::none(),
        nb::sig("def paged_attention(queries: mlx.core.array, key_pages: mlx.core.array, "
                "value_pages: mlx.core.array, block_table: mlx.core.array, "
                "context_lens: mlx.core.array, page_size: int, *, scale: float | None = None, "
                "mask: str | None = None, stream: mlx.core.Stream | mlx.core.Device | None = "
                "None) -> mlx.core.array"),
        "Attention of queries [B,Hq,L,D] over K/V read through block_table int32 [B,max_pages] "
        "from key_pages/value_pages [P,Hkv,ps,D]; context_lens int32 [B]. mask None or "
        "'causal' (bottom-right aligned). Returns [B,Hq,L,D] in the queries' dtype.");

  m.def("write_kv", &pagekernels::write_kv, "key_pages"_a, "value_pages"_a, "keys"_a, "values"_a,
        "slot_mapping"_a, nb::kw_only(), "stream"_a = nb::none(),
        nb::sig("def write_kv(key_pages: mlx.core.array, value_pages: mlx.core.array, "
                "keys: mlx.core.array, values: mlx.core.array, slot_mapping: mlx.core.array, *, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> "
                "tuple[mlx.core.array, mlx.core.array]"),
        "Write keys/values [T,Hkv,D] into slots slot_mapping int32 [T] of the pages, in place "
        "(negative slots skipped). Returns (key_pages, value_pages) sharing the pages' buffers.");

  m.def("gather_kv", &pagekernels::gather_kv, "key_pages"_a, "value_pages"_a, "block_table"_a,
        "context_lens"_a, "page_size"_a, nb::kw_only(), "stream"_a = nb::none(),
        nb::sig("def gather_kv(key_pages: mlx.core.array, value_pages: mlx.core.array, "
                "block_table: mlx.core.array, context_lens: mlx.core.array, page_size: int, *, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> "
                "tuple[mlx.core.array, mlx.core.array]"),
        "Dense K/V [B,Hkv,max_pages*ps,D] of each row's pages, zeros past context_lens[b].");

  m.def("dense_attention", &pagekernels::dense_attention, "queries"_a, "keys"_a, "values"_a,
        nb::kw_only(), "scale"_a = nb::none(), "mask"_a = nb::none(), "key_lens"_a = nb::none(),
        "stream"_a = nb::none(),
        nb::sig("def dense_attention(queries: mlx.core.array, keys: mlx.core.array, "
                "values: mlx.core.array, *, scale: float | None = None, "
                "mask: str | None = None, key_lens: mlx.core.array | None = None, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
        "Attention of queries [B,Hq,L,D] over keys/values [B,Hkv,S,D], the first key_lens[b] "
        "keys of each row (int32 [B]; None: S). Same kernel as paged_attention.");

  m.def("quantized_embedding", &pagekernels::quantized_embedding, "indices"_a, "weight"_a,
        "scales"_a, "biases"_a, nb::kw_only(), "group_size"_a, "bits"_a, "stream"_a = nb::none(),
        nb::sig("def quantized_embedding(indices: mlx.core.array, weight: mlx.core.array, "
                "scales: mlx.core.array, biases: mlx.core.array, *, group_size: int, bits: int, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
        "Rows of an mx.quantize'd (affine) table: weight uint32 [V,dims*bits/32], "
        "scales/biases [V,dims/group_size]. Returns [*indices.shape, dims] in the scales' "
        "dtype; out-of-range indices give zero rows.");

  m.def("linear", &pagekernels::linear, "x"_a, "weight"_a, nb::kw_only(),
        "use_kernel"_a = nb::none(), "stream"_a = nb::none(),
        nb::sig("def linear(x: mlx.core.array, weight: mlx.core.array, *, "
                "use_kernel: bool | None = None, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
        "x [..., K] @ weight [N, K]^T -> [..., N]. use_kernel: None = the small-batch CUDA "
        "kernel where it applies (GPU, one float16/bfloat16 dtype, <= 16 rows, K % 64 == 0), "
        "else matmul; True = always our kernel (on the CPU a plain loop); False = matmul.");
  m.def("split_linear", &pagekernels::split_linear, "x"_a, "weight"_a, "widths"_a, nb::kw_only(),
        "use_kernel"_a = nb::none(), "stream"_a = nb::none(),
        nb::sig("def split_linear(x: mlx.core.array, weight: mlx.core.array, "
                "widths: collections.abc.Sequence[int], *, use_kernel: bool | None = None, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) "
                "-> list[mlx.core.array]"),
        "x [..., K] @ weight [N, K]^T split along N into parts of `widths` (summing to N, at "
        "most 4): one [..., N_i] array each (contiguous where the kernel runs, which streams "
        "the weights once). use_kernel as for linear.");
  m.def("add_rms_norm", &pagekernels::add_rms_norm, "residual"_a, "update"_a, "weight"_a,
        nb::kw_only(), "eps"_a, "stream"_a = nb::none(),
        nb::sig("def add_rms_norm(residual: mlx.core.array, update: mlx.core.array, "
                "weight: mlx.core.array, *, eps: float, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) "
                "-> tuple[mlx.core.array, mlx.core.array]"),
        "(residual + update, rms_norm(residual + update) * weight) over the last axis in one "
        "kernel (GPU rows past 8192 elements: MLX's add and rms_norm): residual/update "
        "[..., H], weight [H], one float dtype.");
  m.attr("linear_max_rows") = pagekernels::kLinearMaxRows;
  m.attr("linear_max_parts") = pagekernels::kLinearMaxParts;

  m.def("norm_rope", &pagekernels::norm_rope, "x"_a, "weight"_a, "offsets"_a, nb::kw_only(),
        "eps"_a, "base"_a, "stream"_a = nb::none(),
        nb::sig("def norm_rope(x: mlx.core.array, weight: mlx.core.array, "
                "offsets: mlx.core.array, *, eps: float, base: float, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) -> mlx.core.array"),
        "RMSNorm (times weight [D]) then non-traditional RoPE of each [D] row of x [B,L,H,D], "
        "at positions offsets[b] + l (int32 [B]), frequencies base^(-2i/D). Returns "
        "[B,H,L,D] in x's dtype. D even; the GPU kernel takes D % 64 == 0 up to 256 (other D "
        "run MLX's rms_norm and rope there).");

  m.def("decoder_layer", &pagekernels::decoder_layer, "residual"_a, "pending"_a.none(),
        "weights"_a, "key_pages"_a, "value_pages"_a, "block_table"_a, "context_lens"_a,
        "slot_mapping"_a, "offsets"_a, "page_size"_a, nb::kw_only(), "eps"_a, "rope_base"_a,
        "scale"_a = nb::none(), "stream"_a = nb::none(),
        nb::sig("def decoder_layer(residual: mlx.core.array, pending: mlx.core.array | None, "
                "weights: collections.abc.Sequence[mlx.core.array], key_pages: mlx.core.array, "
                "value_pages: mlx.core.array, block_table: mlx.core.array, "
                "context_lens: mlx.core.array, slot_mapping: mlx.core.array, "
                "offsets: mlx.core.array, page_size: int, *, eps: float, rope_base: float, "
                "scale: float | None = None, "
                "stream: mlx.core.Stream | mlx.core.Device | None = None) "
                "-> tuple[mlx.core.array, mlx.core.array, mlx.core.array, mlx.core.array]"),
        "One pre-norm Qwen3 decoder layer over paged K/V: residual/pending [B, L, H], the "
        "layer's 8 weights (see pagekernels.h), pages and the step's tables. Returns (h, mlp, "
        "key_pages, value_pages); a GPU decode step is one graph node.");
}
