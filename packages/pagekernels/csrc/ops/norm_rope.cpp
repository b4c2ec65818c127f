// norm_rope: op function (boundary checks), NormRope::eval_gpu and the rotation frequencies.
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "mlx/backend/cpu/simd/math.h"
#include "mlx/fast.h"
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "norm_rope";
}  // namespace

mx::array norm_rope(const mx::array& x, const mx::array& weight, const mx::array& offsets,
                    float eps, float base, mx::StreamOrDevice s) {
  check_rank(kOp, x, "x", 4, "[B, L, H, D]");
  check_float_dtype(kOp, x, "x");
  const int head_dim = x.shape(3);
  check(head_dim > 0 && head_dim % 2 == 0, kOp, [&] {
    return "head dim D=x.shape[3]=" + std::to_string(head_dim) +
           " must be even and positive (RoPE rotates the pairs (i, i + D/2))";
  });
  check_rank(kOp, weight, "weight", 1, "[D]");
  check_dim(kOp, x, 3, "x", weight, 0, "weight");
  check_same_dtype(kOp, x, "x", weight, "weight");
  check_rank(kOp, offsets, "offsets", 1, "[B]");
  check_dtype(kOp, offsets, "offsets", mx::int32);
  check_dim(kOp, x, 0, "x", offsets, 0, "offsets");
  check_finite_positive(kOp, "eps", eps);
  check_finite_positive(kOp, "base", base);
  auto stream = mx::to_stream(s);
  if (stream.device == mx::Device::gpu && !gpu_norm_rope_supports_head_dim(head_dim)) {
    // Head dims the CUDA kernel does not take run MLX's own two kernels.
    auto normed = mx::transpose(mx::fast::rms_norm(x, weight, eps, stream), {0, 2, 1, 3}, stream);
    return mx::fast::rope(normed, head_dim, false, base, 1.0f, offsets, std::nullopt, stream);
  }

  // x goes in as it is: both kernels read its strides, so a view of a fused QKV projection
  // costs no copy and no Contiguous node.
  const auto& shape = x.shape();
  return mx::array({shape[0], shape[2], shape[1], shape[3]}, x.dtype(),
                   std::make_shared<NormRope>(stream, eps, base),
                   {x, row_contiguous(weight, stream), row_contiguous(offsets, stream)});
}

void NormRope::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  // x is read through its strides; weight and offsets are indexed densely.
  cuda::norm_rope(inputs[0], cuda::row_major(inputs[1], stream()),
                  cuda::row_major(inputs[2], stream()), outputs[0], eps_,
                  rope_inv_frequencies(inputs[0].shape(3), base_).data(), stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

// At position p the reference rotates pair i by the float32 angle p * f_i. Positions reach
// 32k and more, so one ulp of f_i moves the angle by ~1e-3 rad: the frequencies must be MLX's
// own, bit for bit. Its CPU rope (the fallback in mlx/fast.cpp, which the reference runs)
// computes f_i = exp(float(-i) * float(log(base) / (D/2))) with its CPU exp, which differs from
// a correctly rounded exp by a few ulps; mlx::core::simd::exp is that function.
std::span<const float> rope_inv_frequencies(int head_dim, float base) {
  static std::mutex mutex;
  static std::map<std::pair<int, float>, std::vector<float>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = cache.try_emplace({head_dim, base});
  if (inserted) {
    const int half = head_dim / 2;
    const float log_step = std::log(base) / static_cast<float>(half);
    it->second.resize(half);
    for (int i = 0; i < half; ++i) {
      const mx::simd::Simd<float, 1> exponent(static_cast<float>(-i) * log_step);
      it->second[i] = mx::simd::exp(exponent).value;
    }
  }
  return it->second;
}

}  // namespace pagekernels
