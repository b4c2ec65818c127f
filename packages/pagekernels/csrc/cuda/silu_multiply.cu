// pagekernels::cuda::silu_multiply: a SwiGLU MLP's activation, silu(gate) * up, in float32 with
// one rounding (MLX's nn.silu(gate) * up rounds after the sigmoid, the product and the multiply).
// A decode step's rows are B x I elements: the kernel is one small launch.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"

namespace pagekernels::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    silu_multiply_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                         T* __restrict__ out, int64_t size) {
  const int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i >= size) return;
  const float g = to_float(gate[i]);
  out[i] = from_float<T>(g / (1.0f + __expf(-g)) * to_float(up[i]));
}

}  // namespace

void silu_multiply(const mx::array& gate, const mx::array& up, mx::array& out,
                   const mx::Stream& s) {
  NvtxRange range("pagekernels::silu_multiply");
  auto& enc = mx::cu::get_command_encoder(s);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  enc.set_input_array(gate);
  enc.set_input_array(up);
  enc.set_output_array(out);
  int64_t size = static_cast<int64_t>(out.size());
  const dim3 grid(static_cast<unsigned>((size + kThreads - 1) / kThreads));
  dispatch_float(out.dtype(), "silu_multiply", [&](auto tag) {
    using T = decltype(tag);
    const T* gs = mx::gpu_ptr<T>(gate);
    const T* us = mx::gpu_ptr<T>(up);
    T* os = mx::gpu_ptr<T>(out);
    const KernelInfo info =
        kernel_info(enc, reinterpret_cast<const void*>(&silu_multiply_kernel<T>), kThreads, 0);
    add_kernel(enc, info, grid, kThreads, 0, gs, us, os, size);
  });
}

}  // namespace pagekernels::cuda
