// NormRope::eval_cpu: per (b, l, h) row of D elements, RMSNorm (fp32 sum of squares) times the
// weight, then the rotation of the pairs (i, i + D/2); all in fp32, one rounding to the output.
// x may be strided; weight and offsets arrive row-contiguous.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/dispatch.h"
#include "cpu/parallel.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr int kRowsPerTask = 64;
// Work per element for parallel_tasks (in multiply-adds): a sin and a cos per pair dominate.
constexpr int64_t kWorkPerElement = 16;

struct RowScratch {
  std::vector<float> values;  // one row of x in fp32
};

}  // namespace

void NormRope::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& x = inputs[0];
  const auto& weight = inputs[1];
  const auto& offsets = inputs[2];
  auto& out = outputs[0];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);
  const int L = x.shape(1), H = x.shape(2), D = x.shape(3);
  const int64_t rows = static_cast<int64_t>(x.shape(0)) * L * H;
  const int64_t batch_stride = x.strides(0), token_stride = x.strides(1);
  const int64_t head_stride = x.strides(2), element_stride = x.strides(3);
  const float* inv_freqs = rope_inv_frequencies(D, base_).data();  // cached: outlives the task
  cpu::dispatch_float(x.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    enc.dispatch([xs = x.data<T>(), ws = weight.data<T>(), pos0 = offsets.data<int32_t>(),
                  ys = out.data<T>(), inv_freqs, rows, L, H, D, batch_stride, token_stride,
                  head_stride, element_stride, eps = eps_] {
      const int half = D / 2;
      const int tasks = static_cast<int>((rows + kRowsPerTask - 1) / kRowsPerTask);
      cpu::parallel_tasks<RowScratch>(tasks, rows * D * kWorkPerElement, [&](int task,
                                                                            RowScratch& scratch) {
        scratch.values.resize(D);
        float* v = scratch.values.data();
        const int64_t end = std::min(rows, static_cast<int64_t>(task + 1) * kRowsPerTask);
        for (int64_t row = static_cast<int64_t>(task) * kRowsPerTask; row < end; ++row) {
          const int h = static_cast<int>(row % H);
          const int l = static_cast<int>(row / H % L);
          const int64_t b = row / H / L;
          const T* src = xs + b * batch_stride + l * token_stride + h * head_stride;
          float sum_squares = 0.0f;
          for (int i = 0; i < D; ++i) {
            v[i] = cpu::to_float(src[i * element_stride]);
            sum_squares += v[i] * v[i];
          }
          // As mx.fast.rms_norm: mean as sum * (1/D), then 1/sqrt; the normed value is x * r
          // times the weight (the reference rounds it to T in between; we stay in fp32).
          const float r = 1.0f / std::sqrt(sum_squares * (1.0f / static_cast<float>(D)) + eps);
          // As mx.fast.rope: a float32 position, then a float32 angle per pair.
          const float position = static_cast<float>(l) + static_cast<float>(pos0[b]);
          T* dst = ys + ((b * H + h) * L + l) * D;
          for (int i = 0; i < half; ++i) {
            const float x1 = v[i] * r * cpu::to_float(ws[i]);
            const float x2 = v[i + half] * r * cpu::to_float(ws[i + half]);
            const float theta = position * inv_freqs[i];
            const float cos_t = std::cos(theta), sin_t = std::sin(theta);
            dst[i] = cpu::from_float<T>(x1 * cos_t - x2 * sin_t);
            dst[i + half] = cpu::from_float<T>(x1 * sin_t + x2 * cos_t);
          }
        }
      });
    });
  });
}

}  // namespace pagekernels
