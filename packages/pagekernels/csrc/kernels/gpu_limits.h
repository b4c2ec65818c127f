// Shapes the CUDA kernels take, the one rule for both sides: the op functions apply them for
// GPU streams (the attention head dims as a ValueError at the op boundary, never at eval time;
// norm_rope's head dims, add_rms_norm's width and the strided-input rank by routing other shapes
// to MLX's own ops or a host-side reshape), and the CUDA launchers size their kernels by them.
// The CPU kernels take any size.
#pragma once

namespace pagekernels {

constexpr int kGpuMaxHeadDim = 256;

// 16-byte vector loads of K/V rows: D a multiple of 8 (bf16/f16) up to kGpuMaxHeadDim.
constexpr bool gpu_supports_head_dim(int head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= kGpuMaxHeadDim;
}

// norm_rope: one warp per row, each lane holding D/64 elements of either half of the row.
constexpr int kNormRopeMaxHeadDim = 256;

constexpr bool gpu_norm_rope_supports_head_dim(int head_dim) {
  return head_dim > 0 && head_dim % 64 == 0 && head_dim <= kNormRopeMaxHeadDim;
}

// Rank of a strided input eval_gpu copies to row-major itself (cuda/row_major.cu); the ops that
// take inputs of any rank reshape higher ranks on the host first.
constexpr int kGpuMaxStridedRank = 8;

// Output parts of one linear / split_linear call.
constexpr int kLinearMaxParts = 4;

// add_rms_norm: one CTA per row, each of up to 1024 threads holding 8 elements in registers.
constexpr int kAddRmsNormMaxWidth = 8 * 1024;

}  // namespace pagekernels
