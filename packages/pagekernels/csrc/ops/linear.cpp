// linear: op function (boundary checks, kernel or mx::matmul) and Linear::eval_gpu.
#include <algorithm>

#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr std::string_view kOp = "linear";

// Why the kernel does not take these inputs on this stream ("" when it does). The CPU loop
// takes any float dtype, row count and K; the CUDA kernel float16/bfloat16, at most
// kLinearMaxRows rows and K % 64 == 0.
std::string kernel_mismatch(const mx::array& x, const mx::array& weight, bool gpu) {
  if (x.dtype() != weight.dtype()) {
    return "the kernel takes x and weight of one dtype, got " + dtype_str(x.dtype()) + " and " +
           dtype_str(weight.dtype());
  }
  if (!gpu) return "";
  if (x.dtype() != mx::float16 && x.dtype() != mx::bfloat16) {
    return "the CUDA kernel takes float16 or bfloat16, got " + dtype_str(x.dtype());
  }
  const int64_t rows = x.size() / std::max(x.shape(-1), 1);
  if (rows > kLinearMaxRows) {
    return "the CUDA kernel takes at most " + std::to_string(kLinearMaxRows) + " rows, got " +
           std::to_string(rows);
  }
  if (weight.shape(1) % 64 != 0) {
    return "the CUDA kernel needs K % 64 == 0, got K=" + std::to_string(weight.shape(1));
  }
  return "";
}

}  // namespace

mx::array linear(const mx::array& x, const mx::array& weight, std::optional<bool> use_kernel,
                 mx::StreamOrDevice s) {
  check(x.ndim() >= 1, kOp, [&] { return "x must have rank >= 1 [..., K], got a scalar"; });
  check_rank(kOp, weight, "weight", 2, "[N, K]");
  check_float_dtype(kOp, x, "x");
  check_float_dtype(kOp, weight, "weight");
  check(x.shape(-1) == weight.shape(1), kOp, [&] {
    return "x.shape[-1]=" + std::to_string(x.shape(-1)) + " must equal weight.shape[1]=" +
           std::to_string(weight.shape(1)) + " (K) for x of shape " + shape_str(x) +
           " and weight of shape " + shape_str(weight);
  });
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu;
  const std::string mismatch = kernel_mismatch(x, weight, gpu);
  if (use_kernel.value_or(false)) {
    check(mismatch.empty(), kOp, [&] { return "use_kernel=True but " + mismatch; });
  }
  const bool kernel = use_kernel.value_or(gpu && mismatch.empty());
  if (!kernel || x.size() == 0 || weight.shape(0) == 0) {
    return mx::matmul(x, mx::transpose(weight, stream), stream);
  }
  // Strided or offset inputs are handled inside the kernels (eval_cpu reads strides, eval_gpu
  // copies them first), so the usual contiguous case adds no Contiguous node to the graph.
  const int K = weight.shape(1);
  auto rows = mx::reshape(x, {-1, K}, stream);
  auto out = mx::array({rows.shape(0), weight.shape(0)}, x.dtype(),
                       std::make_shared<Linear>(stream), {rows, weight});
  auto out_shape = x.shape();
  out_shape.back() = weight.shape(0);
  return mx::reshape(out, out_shape, stream);
}

void Linear::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  cuda::linear(inputs[0], inputs[1], outputs[0], stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
