// pagekernels::cuda::row_major: dense row-major copies of strided inputs, made inside eval_gpu.
//
// The kernels index their inputs as dense row-major buffers. The op functions could add an
// mx::contiguous node per input instead, but inside a decode step those nodes cost host time on
// every call while the inputs almost always are row-major already; here the rare strided input
// (a transpose, a broadcast) is copied by one kernel when the graph is built.
#include <string>

#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

namespace {

constexpr int kMaxDims = kGpuMaxStridedRank;
constexpr int kThreads = 256;

struct Layout {
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];  // in elements
  int ndim;
};

template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    copy_row_major_kernel(const Unit* src, Unit* dst, Layout layout, int64_t size) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= size) return;
  int64_t offset = 0;
  int64_t rest = i;
  for (int d = layout.ndim - 1; d >= 0; --d) {
    offset += rest % layout.shape[d] * layout.strides[d];
    rest /= layout.shape[d];
  }
  dst[i] = src[offset];
}

template <typename Unit>
void launch_copy(Encoder& enc, const mx::array& a, mx::array& copy) {
  Layout layout{};
  layout.ndim = a.ndim();
  for (int d = 0; d < a.ndim(); ++d) {
    layout.shape[d] = a.shape(d);
    layout.strides[d] = a.strides(d);
  }
  const Unit* src = mx::gpu_ptr<Unit>(a);
  Unit* dst = mx::gpu_ptr<Unit>(copy);
  int64_t size = a.size();
  const KernelInfo info =
      kernel_info(enc, reinterpret_cast<const void*>(&copy_row_major_kernel<Unit>), kThreads, 0);
  const auto blocks = static_cast<unsigned>((size + kThreads - 1) / kThreads);
  add_kernel(enc, info, dim3(blocks), kThreads, 0, src, dst, layout, size);
}

}  // namespace

mx::array row_major(const mx::array& a, const mx::Stream& s, bool aligned16) {
  const bool aligned = !aligned16 || reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(a)) % 16 == 0;
  if (a.size() == 0 || (a.flags().row_contiguous && aligned)) return a;
  if (a.ndim() > kMaxDims) {
    throw std::runtime_error("[pagekernels] cannot copy a strided array of rank " +
                             std::to_string(a.ndim()) + " (at most " +
                             std::to_string(kMaxDims) + ")");
  }
  auto& enc = mx::cu::get_command_encoder(s);
  mx::array copy = scratch_array(enc, a.shape(), a.dtype());
  enc.set_input_array(a);
  enc.set_output_array(copy);
  // The ops take 16-bit floats and 32-bit floats, integers and packed quantized words.
  switch (a.itemsize()) {
    case 2:
      launch_copy<uint16_t>(enc, a, copy);
      break;
    case 4:
      launch_copy<uint32_t>(enc, a, copy);
      break;
    default:
      throw std::logic_error("[pagekernels] unexpected element size in row_major");
  }
  return copy;
}

std::vector<mx::array> row_major(const std::vector<mx::array>& arrays, const mx::Stream& s) {
  std::vector<mx::array> dense;
  dense.reserve(arrays.size());
  for (const auto& a : arrays) dense.push_back(row_major(a, s));
  return dense;
}

}  // namespace pagekernels::cuda
