// linear / split_linear: op functions (boundary checks, kernel or mx::matmul) and
// Linear::eval_gpu.
#include <algorithm>
#include <iterator>
#include <limits>
#include <numeric>

#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {

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

// Both ops: x @ weight^T split along N into `widths` (one part for `linear`); `op` names the
// caller in error messages.
std::vector<mx::array> project(std::string_view op, const mx::array& x, const mx::array& weight,
                               const std::vector<int>& widths, std::optional<bool> use_kernel,
                               mx::StreamOrDevice s) {
  check(x.ndim() >= 1, op, [&] { return "x must have rank >= 1 [..., K], got a scalar"; });
  check_rank(op, weight, "weight", 2, "[N, K]");
  check_float_dtype(op, x, "x");
  check_float_dtype(op, weight, "weight");
  check(x.shape(-1) == weight.shape(1), op, [&] {
    return "x.shape[-1]=" + std::to_string(x.shape(-1)) + " must equal weight.shape[1]=" +
           std::to_string(weight.shape(1)) + " (K) for x of shape " + shape_str(x) +
           " and weight of shape " + shape_str(weight);
  });
  const int64_t total =
      std::accumulate(widths.begin(), widths.end(), int64_t{0}, [](int64_t sum, int w) {
        return w < 0 ? std::numeric_limits<int64_t>::min() : sum + w;
      });
  check(!widths.empty() && widths.size() <= size_t{kLinearMaxParts} && total == weight.shape(0), op,
        [&] {
          std::string listed;
          for (int w : widths) listed += (listed.empty() ? "" : ", ") + std::to_string(w);
          return "widths must be 1 to " + std::to_string(kLinearMaxParts) +
                 " non-negative output widths summing to weight.shape[0]=" +
                 std::to_string(weight.shape(0)) + " (N), got [" + listed + "]";
        });
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu;
  const std::string mismatch = kernel_mismatch(x, weight, gpu);
  if (use_kernel.value_or(false)) {
    check(mismatch.empty(), op, [&] { return "use_kernel=True but " + mismatch; });
  }
  const bool kernel = use_kernel.value_or(gpu && mismatch.empty());
  if (!kernel || x.size() == 0 || weight.shape(0) == 0) {
    auto product = mx::matmul(x, mx::transpose(weight, stream), stream);
    if (widths.size() == 1) return {product};
    mx::Shape boundaries;
    std::partial_sum(widths.begin(), widths.end() - 1, std::back_inserter(boundaries));
    return mx::split(product, boundaries, -1, stream);
  }
  // Strided or offset inputs are handled inside the kernels (eval_cpu reads strides, eval_gpu
  // copies them first), so the usual contiguous case adds no Contiguous node to the graph. On
  // GPU streams eval_gpu also reads x's leading dims as rows itself: a decode step's projection
  // is one graph node, with no reshape in or out.
  const auto dtypes = std::vector<mx::Dtype>(widths.size(), x.dtype());
  auto linear_op = std::make_shared<Linear>(stream, widths);
  if (gpu && x.ndim() <= kGpuMaxStridedRank) {
    std::vector<mx::Shape> shapes;
    for (int w : widths) {
      shapes.push_back(x.shape());
      shapes.back().back() = w;
    }
    return mx::array::make_arrays(std::move(shapes), dtypes, linear_op, {x, weight});
  }
  const int K = weight.shape(1);
  auto rows = mx::reshape(x, {-1, K}, stream);
  std::vector<mx::Shape> shapes;
  for (int w : widths) shapes.push_back({rows.shape(0), w});
  auto parts = mx::array::make_arrays(std::move(shapes), dtypes, linear_op, {rows, weight});
  auto part_shape = x.shape();
  for (size_t i = 0; i < parts.size(); ++i) {
    part_shape.back() = widths[i];
    parts[i] = mx::reshape(parts[i], part_shape, stream);
  }
  return parts;
}

}  // namespace

std::vector<mx::array> split_linear(const mx::array& x, const mx::array& weight,
                                    const std::vector<int>& widths,
                                    std::optional<bool> use_kernel, mx::StreamOrDevice s) {
  return project("split_linear", x, weight, widths, use_kernel, s);
}

mx::array linear(const mx::array& x, const mx::array& weight, std::optional<bool> use_kernel,
                 mx::StreamOrDevice s) {
  check_rank("linear", weight, "weight", 2, "[N, K]");
  return project("linear", x, weight, {weight.shape(0)}, use_kernel, s)[0];
}

void Linear::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  cuda::linear(inputs[0], inputs[1], outputs, stream());
#else
  throw_no_gpu_kernels("linear");
#endif
}

}  // namespace pagekernels
