// The per-row math of norm_rope (RMSNorm times weight, then non-traditional RoPE of one [D] row
// held by one warp), shared by the norm_rope kernel and the decoder layer's q/k/v kernel. See
// norm_rope.cu for the mapping and for why the frequencies come from the host.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/device_utils.cuh"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

// 512 bytes of kernel parameters: the graph node owns its copy, so no device buffer to manage.
struct Frequencies {
  float inv[kNormRopeMaxHeadDim / 2];
};

constexpr bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// N elements moved as one access of N * sizeof(T) bytes (N a power of two, address aligned).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N, bool kVector>
__device__ __forceinline__ void load_lane(const T* p, int64_t stride, float (&out)[N]) {
  if constexpr (kVector) {
    const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_float(pack.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = to_float(p[k * stride]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_lane(T* p, const float (&in)[N]) {
  if constexpr (is_power_of_two(N)) {
    Pack<T, N> pack;
#pragma unroll
    for (int k = 0; k < N; ++k) pack.v[k] = from_float<T>(in[k]);
    *reinterpret_cast<Pack<T, N>*>(p) = pack;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k] = from_float<T>(in[k]);
  }
}

// The D/2 frequencies as a kernel parameter; D must be a norm_rope kernel head dim (the op
// functions route other D elsewhere, so another D here is a logic error).
inline Frequencies frequencies(const char* op, const float* inv_freqs, int head_dim) {
  if (!gpu_norm_rope_supports_head_dim(head_dim)) {
    throw std::logic_error(std::string("[") + op + "] the CUDA kernels take D % 64 == 0 up to " +
                           std::to_string(kNormRopeMaxHeadDim) + ", got D=" +
                           std::to_string(head_dim));
  }
  Frequencies freqs{};
  std::copy(inv_freqs, inv_freqs + head_dim / 2, freqs.inv);
  return freqs;
}

// Calls f(std::integral_constant<int, D>{}) for a norm_rope kernel head dim D.
template <typename F>
void dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 192:
      return f(std::integral_constant<int, 192>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}

// Copies the frequencies into shared memory; every thread of the CTA must call it (it syncs).
template <int kHeadDim>
__device__ __forceinline__ void load_frequencies(const Frequencies& freqs, float* inv_freq) {
  for (int i = threadIdx.x; i < kHeadDim / 2; i += blockDim.x) inv_freq[i] = freqs.inv[i];
  __syncthreads();
}

// One warp: row `src` (elements `element_stride` apart; kVector: contiguous and aligned for
// N-element accesses) normed with `weight`, rotated at `position`, written to `dst`
// (contiguous). Lane j holds elements j*N .. j*N + N - 1 of both halves (N = D/64).
template <typename T, int kHeadDim, bool kVector>
__device__ __forceinline__ void norm_rope_row(const T* src, int64_t element_stride,
                                              const T* weight, float position,
                                              const float* inv_freq, float eps, T* dst) {
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kPerLane = kHalf / 32;
  const int first = (threadIdx.x % 32) * kPerLane;
  src += first * element_stride;
  float lo[kPerLane], hi[kPerLane];
  load_lane<T, kPerLane, kVector>(src, element_stride, lo);
  load_lane<T, kPerLane, kVector>(src + kHalf * element_stride, element_stride, hi);

  float sum_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) sum_squares += lo[k] * lo[k] + hi[k] * hi[k];
  sum_squares = group_sum<32>(sum_squares);
  const float r = 1.0f / sqrtf(sum_squares * (1.0f / kHeadDim) + eps);

#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int i = first + k;
    const float x1 = lo[k] * r * to_float(weight[i]);
    const float x2 = hi[k] * r * to_float(weight[i + kHalf]);
    float sin_t, cos_t;
    sincosf(__fmul_rn(position, inv_freq[i]), &sin_t, &cos_t);
    lo[k] = x1 * cos_t - x2 * sin_t;
    hi[k] = x1 * sin_t + x2 * cos_t;
  }
  store_lane<T, kPerLane>(dst + first, lo);
  store_lane<T, kPerLane>(dst + first + kHalf, hi);
}

}  // namespace pagekernels::cuda
