// add_rms_norm: op function (boundary checks) and AddRMSNorm::eval_gpu.
#include <cmath>

#include "mlx/fast.h"
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "add_rms_norm";
}  // namespace

std::pair<mx::array, mx::array> add_rms_norm(const mx::array& residual, const mx::array& update,
                                             const mx::array& weight, float eps,
                                             mx::StreamOrDevice s) {
  check(residual.ndim() >= 1, kOp, [&] {
    return std::string("residual must have rank >= 1 [..., H], got a scalar");
  });
  check_same_shape(kOp, residual, "residual", update, "update");
  check_rank(kOp, weight, "weight", 1, "[H]");
  check_float_dtype(kOp, residual, "residual");
  check_same_dtype(kOp, residual, "residual", update, "update");
  check_same_dtype(kOp, residual, "residual", weight, "weight");
  check_dim(kOp, residual, residual.ndim() - 1, "residual", weight, 0, "weight");
  check_finite_positive(kOp, "eps", eps);
  auto stream = mx::to_stream(s);
  if (stream.device == mx::Device::gpu && residual.shape(-1) > kAddRmsNormMaxWidth) {
    // Rows wider than the CUDA kernel holds in registers run MLX's add and rms_norm.
    auto sum = mx::add(residual, update, stream);
    return {sum, mx::fast::rms_norm(sum, weight, eps, stream)};
  }
  auto primitive = std::make_shared<AddRMSNorm>(stream, eps);
  const std::vector<mx::Dtype> dtypes{residual.dtype(), residual.dtype()};
  if (stream.device == mx::Device::gpu && residual.ndim() <= kGpuMaxStridedRank) {
    // eval_gpu reads the leading dims as rows (copying a strided input first): one graph node.
    auto outputs = mx::array::make_arrays({residual.shape(), residual.shape()}, dtypes, primitive,
                                          {residual, update, weight});
    return {outputs[0], outputs[1]};
  }
  // The CPU kernel takes [rows, H] with any strides: a reshape, which copies only what cannot
  // be viewed that way (also for GPU inputs of a rank eval_gpu does not copy).
  const int H = residual.shape(-1);
  // An empty row (H = 0) has no -1 to infer: [0, 0] holds the same (zero) elements.
  const mx::Shape rows_shape{H == 0 ? 0 : static_cast<int>(residual.size() / H), H};
  auto rows_of = [&](const mx::array& a) { return mx::reshape(a, rows_shape, stream); };
  auto outputs = mx::array::make_arrays({rows_shape, rows_shape}, dtypes, primitive,
                                        {rows_of(residual), rows_of(update), weight});
  return {mx::reshape(outputs[0], residual.shape(), stream),
          mx::reshape(outputs[1], residual.shape(), stream)};
}

void AddRMSNorm::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::add_rms_norm(in[0], &in[1], in[2], outputs[0], outputs[1], eps_, stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
