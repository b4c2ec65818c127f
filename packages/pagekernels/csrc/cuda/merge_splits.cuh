// Split-K merge: combines the num_splits normalised partial rows of each query row by their
// base-2 LSE (design brief 2.3). One warp per row: lane s holds split s's weight (32 splits per
// round, broadcast by shuffle), each lane accumulates 4 dims per 128. The loop over splits is
// branch-free so its loads overlap. Empty splits (lse = -inf, o = 0) weigh nothing; a row whose
// splits are all empty becomes zeros.
#pragma once

#include <cstdint>

#include "cuda/device_utils.cuh"

namespace pagekernels::cuda {

constexpr int kMergeWarps = 4;

template <typename T>
__global__ void __launch_bounds__(32 * kMergeWarps)
    merge_splits_kernel(const float* partial_out, const float* partial_lse, T* out, int64_t rows,
                        int num_splits, int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* lse = partial_lse + row * num_splits;
  const float* part = partial_out + row * num_splits * head_dim;

  float lse_max = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) lse_max = fmaxf(lse_max, lse[s]);
  lse_max = group_max<32>(lse_max);
  const float shift = lse_max == -INFINITY ? 0.0f : lse_max;  // all empty: every weight is 0

  // Every lane runs every iteration (the shuffles need the whole warp); lanes past head_dim
  // only skip their loads and stores.
  for (int d_base = 0; d_base < head_dim; d_base += 128) {
    const int d0 = d_base + 4 * lane;
    const bool active = d0 < head_dim;
    float acc[4] = {};
    float weight_sum = 0.0f;
    for (int s0 = 0; s0 < num_splits; s0 += 32) {
      const float my_weight = s0 + lane < num_splits ? exp2f(lse[s0 + lane] - shift) : 0.0f;
      const int count = min(32, num_splits - s0);
#pragma unroll 8
      for (int j = 0; j < count; ++j) {
        const float weight = __shfl_sync(0xffffffffu, my_weight, j);
        weight_sum += weight;
        if (active) {
          const float4 o = *reinterpret_cast<const float4*>(part + (s0 + j) * head_dim + d0);
          acc[0] = fmaf(weight, o.x, acc[0]);
          acc[1] = fmaf(weight, o.y, acc[1]);
          acc[2] = fmaf(weight, o.z, acc[2]);
          acc[3] = fmaf(weight, o.w, acc[3]);
        }
      }
    }
    if (!active) continue;
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= inv;
    store_float<T>(out + row * head_dim + d0, acc);
  }
}

}  // namespace pagekernels::cuda
