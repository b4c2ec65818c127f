// pagekernels::cuda::add_rms_norm: one CTA per row writes sum = residual + update (rounded to the
// dtype) and its RMSNorm. A decode step has a handful of rows of a few thousand elements, so the
// kernel's time is latency: each thread loads its kPerThread elements of both inputs and of the
// weight at once (one memory round trip), keeps them in registers through the block reduction,
// and writes both outputs. One graph node where MLX runs two (an add and rms_norm).
#include <algorithm>

#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

namespace {

constexpr int kPerThread = 8;
constexpr int kMaxThreads = kAddRmsNormMaxWidth / kPerThread;

template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1)
    add_rms_norm_kernel(const T* __restrict__ residual, const T* __restrict__ update,
                        const T* __restrict__ weight, T* __restrict__ sum, T* __restrict__ normed,
                        int width, float eps) {
  __shared__ float warp_sums[kMaxThreads / 32];
  const int64_t row = blockIdx.x;
  float x[kPerThread], w[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {  // element i = j * blockDim.x + threadIdx.x
    const int i = j * blockDim.x + threadIdx.x;
    const bool in = i < width;
    const float a = in ? to_float(residual[row * width + i]) : 0.0f;
    const float b = in && update ? to_float(update[row * width + i]) : 0.0f;
    w[j] = in ? to_float(weight[i]) : 0.0f;
    x[j] = to_float(from_float<T>(a + b));  // the sum as stored, which the norm reads
  }
  float squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = j * blockDim.x + threadIdx.x;
    if (i < width) sum[row * width + i] = from_float<T>(x[j]);
    squares += x[j] * x[j];
  }
  squares = group_sum<32>(squares);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.0f;
  for (int k = 0; k < static_cast<int>(blockDim.x / 32); ++k) total += warp_sums[k];
  const float scale = rsqrtf(total / static_cast<float>(width) + eps);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = j * blockDim.x + threadIdx.x;
    if (i < width) normed[row * width + i] = from_float<T>(x[j] * scale * w[j]);
  }
}

}  // namespace

void add_rms_norm(const mx::array& residual, const mx::array* update, const mx::array& weight,
                  mx::array& sum, mx::array& normed, float eps, const mx::Stream& s) {
  NvtxRange range("pagekernels::add_rms_norm");
  auto& enc = mx::cu::get_command_encoder(s);
  sum.set_data(mx::allocator::malloc(sum.nbytes()));
  normed.set_data(mx::allocator::malloc(normed.nbytes()));
  enc.set_input_array(residual);
  if (update) enc.set_input_array(*update);
  enc.set_input_array(weight);
  enc.set_output_array(sum);
  enc.set_output_array(normed);
  int width = residual.shape(-1);  // <= kAddRmsNormMaxWidth (the op routes wider rows to MLX)
  const auto rows = static_cast<unsigned>(residual.size() / width);
  // Whole warps, enough for kPerThread elements each.
  const int threads = std::max(32, (width + 32 * kPerThread - 1) / (32 * kPerThread) * 32);
  dispatch_float(residual.dtype(), "add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* rs = mx::gpu_ptr<T>(residual);
    const T* us = update ? mx::gpu_ptr<T>(*update) : nullptr;
    const T* ws = mx::gpu_ptr<T>(weight);
    T* sums = mx::gpu_ptr<T>(sum);
    T* outs = mx::gpu_ptr<T>(normed);
    const KernelInfo info = kernel_info(
        enc, reinterpret_cast<const void*>(&add_rms_norm_kernel<T>), threads, 0);
    add_kernel(enc, info, dim3(rows), threads, 0, rs, us, ws, sums, outs, width, eps);
  });
}

}  // namespace pagekernels::cuda
