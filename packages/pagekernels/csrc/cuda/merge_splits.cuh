// Split-K merge: combines the num_splits normalised partial rows of each query row by their
// base-2 LSE (design brief 2.3). One warp per row, each lane owns 4 dims per 128.
// Empty splits (lse = -inf) weigh nothing; a row whose splits are all empty becomes zeros.
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

  float lse_max = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) lse_max = fmaxf(lse_max, lse[s]);
  lse_max = group_max<32>(lse_max);

  for (int d0 = 4 * lane; d0 < head_dim; d0 += 128) {
    float acc[4] = {};
    float weight_sum = 0.0f;
    if (lse_max != -INFINITY) {
      for (int s = 0; s < num_splits; ++s) {
        if (lse[s] == -INFINITY) continue;
        const float weight = exp2f(lse[s] - lse_max);
        const float4 part =
            *reinterpret_cast<const float4*>(partial_out + (row * num_splits + s) * head_dim + d0);
        weight_sum += weight;
        acc[0] = fmaf(weight, part.x, acc[0]);
        acc[1] = fmaf(weight, part.y, acc[1]);
        acc[2] = fmaf(weight, part.z, acc[2]);
        acc[3] = fmaf(weight, part.w, acc[3]);
      }
    }
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= inv;
    store_float<T>(out + row * head_dim + d0, acc);
  }
}

}  // namespace pagekernels::cuda
