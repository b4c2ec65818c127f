// The ten pagekernels ops (C++ API; bindings.cpp exposes them as pagekernels._ext).
//
// Shape letters (B, Hq, Hkv, L, S, D, P, ps, T) as defined in the pagekernels package docstring
// (src/pagekernels/__init__.py) and the README.
// Every op validates ranks, shapes and dtypes here (std::invalid_argument -> ValueError) and never
// reads array values: value checks (page ids, padding, coverage) belong to the host metadata
// builders. Every op is lazy like any MLX op.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/gpu_limits.h"
#include "mlx/array.h"
#include "mlx/utils.h"

namespace pagekernels {

namespace mx = mlx::core;

// queries [B,Hq,L,D]; key_pages/value_pages [P,Hkv,ps,D]; block_table int32 [B,max_pages] (-1
// padded); context_lens int32 [B]. mask: none or "causal" (bottom-right aligned to each row's
// context). Returns [B,Hq,L,D] in the queries' dtype; rows with context 0 are zeros.
mx::array paged_attention(const mx::array& queries, const mx::array& key_pages,
                          const mx::array& value_pages, const mx::array& block_table,
                          const mx::array& context_lens, int page_size,
                          std::optional<float> scale = std::nullopt,
                          const std::optional<std::string>& mask = std::nullopt,
                          mx::StreamOrDevice s = {});

// Writes keys/values [T,Hkv,D] into slots slot_mapping int32 [T] (slot = page_id * ps + offset)
// of the pages, in place. Negative and out-of-storage slots are skipped. Returns the updated
// (key_pages, value_pages), which share the input pages' buffers.
std::pair<mx::array, mx::array> write_kv(const mx::array& key_pages, const mx::array& value_pages,
                                         const mx::array& keys, const mx::array& values,
                                         const mx::array& slot_mapping,
                                         mx::StreamOrDevice s = {});

// Dense copies of each row's K/V: ([B,Hkv,max_pages*ps,D], same) with zeros past context_lens[b].
std::pair<mx::array, mx::array> gather_kv(const mx::array& key_pages, const mx::array& value_pages,
                                          const mx::array& block_table,
                                          const mx::array& context_lens, int page_size,
                                          mx::StreamOrDevice s = {});

// queries [B,Hq,L,D]; keys/values [B,Hkv,S,D]; key_lens int32 [B] valid keys per row (none: S).
// Same online-softmax kernel as paged_attention; causal is aligned to key_lens[b].
mx::array dense_attention(const mx::array& queries, const mx::array& keys,
                          const mx::array& values, std::optional<float> scale = std::nullopt,
                          const std::optional<std::string>& mask = std::nullopt,
                          const std::optional<mx::array>& key_lens = std::nullopt,
                          mx::StreamOrDevice s = {});

// Rows `indices` (any integer dtype and shape) of an mx.quantize'd (affine) table: weight uint32
// [V, dims*bits/32], scales/biases [V, dims/group_size]. Returns [*indices.shape, dims] in the
// scales' dtype. Out-of-range indices give rows of zeros.
mx::array quantized_embedding(const mx::array& indices, const mx::array& weight,
                              const mx::array& scales, const mx::array& biases, int group_size,
                              int bits, mx::StreamOrDevice s = {});

// Rows the linear kernel takes at most (a decode step's batch); more rows use mx::matmul.
constexpr int kLinearMaxRows = 16;

// x [..., K] @ weight [N, K]^T -> [..., N] (weight: nn.Linear's layout). use_kernel: none = the
// CUDA kernel where it applies (GPU stream, x and weight both float16 or both bfloat16, at most
// kLinearMaxRows rows, K % 64 == 0), mx::matmul otherwise (dtypes promote as in matmul);
// true = always our kernel: on the GPU where it applies (error otherwise), on the CPU a plain
// fp32-accumulating loop for any float dtype shared by x and weight; false = always mx::matmul.
mx::array linear(const mx::array& x, const mx::array& weight,
                 std::optional<bool> use_kernel = std::nullopt, mx::StreamOrDevice s = {});

// linear against weights stacked along N (for example q_proj, k_proj and v_proj in one
// [Nq + Nk + Nv, K] matrix), returned as one array per block of `widths` (summing to N): the
// parts of x @ weight^T split along the last axis. The kernel streams the weights once for every
// part and writes each as its own contiguous array (off the kernel's path: mx::split views);
// use_kernel as for linear.
std::vector<mx::array> split_linear(const mx::array& x, const mx::array& weight,
                                    const std::vector<int>& widths,
                                    std::optional<bool> use_kernel = std::nullopt,
                                    mx::StreamOrDevice s = {});

// The residual stream of a pre-norm transformer: (sum, normed) with sum = residual + update
// rounded to the inputs' dtype and normed = sum * rsqrt(mean(sum^2) + eps) * weight over the
// last axis (fp32 math on the rounded sum, so normed equals mx.fast.rms_norm(sum, weight, eps)
// up to rounding). residual/update [..., H] of one float dtype, weight [H] of the same dtype.
// One kernel for what is otherwise an add and an RMSNorm (on a GPU stream, rows up to
// kAddRmsNormMaxWidth; wider ones run those two MLX ops).
std::pair<mx::array, mx::array> add_rms_norm(const mx::array& residual, const mx::array& update,
                                             const mx::array& weight, float eps,
                                             mx::StreamOrDevice s = {});
// RMSNorm of each [D] row of x [B,L,H,D] (fp32 sum of squares, times weight [D]), then
// non-traditional RoPE (pairs (i, i + D/2)) at position offsets[b] + l with frequencies
// base^(-2i/D); returns [B,H,L,D] (row-contiguous) in x's dtype. x may be a strided view.
// D even (on a GPU stream the kernel takes D % 64 == 0 up to 256, kernels/gpu_limits.h; other D
// run mx::fast::rms_norm and rope); weight [D] of x's dtype; offsets int32 [B]; eps and base
// finite and positive.
mx::array norm_rope(const mx::array& x, const mx::array& weight, const mx::array& offsets,
                    float eps, float base, mx::StreamOrDevice s = {});

// The weights of one decoder layer, in this order (Hugging Face names; qkv and gate_up stacked
// along N as split_linear takes them): input_layernorm [H], qkv_proj [Hq*D + 2*Hkv*D, H],
// q_norm [D], k_norm [D], o_proj [H, Hq*D], post_attention_layernorm [H],
// gate_up_proj [2*I, H] (gate rows first), down_proj [H, I]. All of one float dtype.
constexpr int kDecoderLayerWeights = 8;

// One pre-norm Qwen3 decoder layer over paged K/V, for residual [B, L, H] plus pending (the
// previous layer's MLP output, [B, L, H], or none for the first layer):
//   h = residual + pending;  x = rms_norm(h) * input_layernorm
//   q, k, v = split(x @ qkv_proj^T);  q, k = norm_rope(q), norm_rope(k) (q_norm / k_norm, RoPE
//   at offsets[b] + l);  pages = write_kv(pages, k, v, slot_mapping)
//   h += paged_attention(q, pages, causal) @ o_proj^T;  x = rms_norm(h) * post_attention_layernorm
//   gate, up = split(x @ gate_up_proj^T);  mlp = (silu(gate) * up) @ down_proj^T
// Returns (h, mlp, key_pages, value_pages); the pages are written in place as by write_kv.
// Hkv and D come from the pages, Hq from qkv_proj's rows. On a GPU stream a decode step (L = 1,
// float16/bfloat16, B <= kLinearMaxRows, H, I and Hq*D multiples of 64, H <= kAddRmsNormMaxWidth,
// D a norm_rope kernel head dim) is one graph node that launches the layer's kernels itself;
// anything else is the same equation composed of the other ops.
std::tuple<mx::array, mx::array, mx::array, mx::array> decoder_layer(
    const mx::array& residual, const std::optional<mx::array>& pending,
    const std::vector<mx::array>& weights, const mx::array& key_pages,
    const mx::array& value_pages, const mx::array& block_table, const mx::array& context_lens,
    const mx::array& slot_mapping, const mx::array& offsets, int page_size, float eps,
    float rope_base, std::optional<float> scale = std::nullopt, mx::StreamOrDevice s = {});

}  // namespace pagekernels
