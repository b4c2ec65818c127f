// pagekernels::cuda::add_rms_norm: one CTA per row writes sum = residual + update (rounded to the
// dtype) and its RMSNorm. A decode step has a handful of rows of a few thousand elements: the
// kernel is one graph node where MLX runs two (an add and rms_norm), and its time is mostly
// launch latency, so it reads elements one at a time with any strides.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"

namespace pagekernels::cuda {

namespace {

constexpr int kThreads = 256;

struct Strided {
  int64_t row, col;
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    add_rms_norm_kernel(const T* residual, Strided r, const T* update, Strided u, const T* weight,
                        int64_t w_col, T* sum, T* normed, int width, float eps) {
  __shared__ float warp_sums[kThreads / 32];
  const int64_t row = blockIdx.x;
  T* sum_row = sum + row * width;
  float squares = 0.0f;
  for (int i = threadIdx.x; i < width; i += kThreads) {
    const T s = from_float<T>(to_float(residual[row * r.row + i * r.col]) +
                              to_float(update[row * u.row + i * u.col]));
    sum_row[i] = s;  // read back below by this same thread
    squares += to_float(s) * to_float(s);
  }
  squares = group_sum<32>(squares);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  const float scale = rsqrtf(total / static_cast<float>(width) + eps);
  T* normed_row = normed + row * width;
  for (int i = threadIdx.x; i < width; i += kThreads) {
    normed_row[i] = from_float<T>(to_float(sum_row[i]) * scale * to_float(weight[i * w_col]));
  }
}

}  // namespace

void add_rms_norm(const mx::array& residual, const mx::array& update, const mx::array& weight,
                  mx::array& sum, mx::array& normed, float eps, const mx::Stream& s) {
  NvtxRange range("pagekernels::add_rms_norm");
  auto& enc = mx::cu::get_command_encoder(s);
  sum.set_data(mx::allocator::malloc(sum.nbytes()));
  normed.set_data(mx::allocator::malloc(normed.nbytes()));
  enc.set_input_array(residual);
  enc.set_input_array(update);
  enc.set_input_array(weight);
  enc.set_output_array(sum);
  enc.set_output_array(normed);
  const auto rows = static_cast<unsigned>(residual.shape(0));
  int width = residual.shape(1);
  Strided r{residual.strides(0), residual.strides(1)};
  Strided u{update.strides(0), update.strides(1)};
  int64_t w_col = weight.strides(0);
  dispatch_float(residual.dtype(), "add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* rs = mx::gpu_ptr<T>(residual);
    const T* us = mx::gpu_ptr<T>(update);
    const T* ws = mx::gpu_ptr<T>(weight);
    T* sums = mx::gpu_ptr<T>(sum);
    T* outs = mx::gpu_ptr<T>(normed);
    const KernelInfo info = kernel_info(
        enc, reinterpret_cast<const void*>(&add_rms_norm_kernel<T>), kThreads, 0);
    add_kernel(enc, info, dim3(rows), kThreads, 0, rs, r, us, u, ws, w_col, sums, outs, width,
               eps);
  });
}

}  // namespace pagekernels::cuda
