// AddRMSNorm::eval_cpu: per row, sum = residual + update (rounded to the dtype), then RMSNorm of
// the rounded sum in fp32. Inputs are [rows, H] with any strides; one task per block of rows.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/dispatch.h"
#include "cpu/parallel.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr int kRowsPerTask = 16;

struct NoScratch {};

}  // namespace

void AddRMSNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& residual = inputs[0];
  const auto& update = inputs[1];
  const auto& weight = inputs[2];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);
  const int rows = residual.shape(0);
  const int width = residual.shape(1);
  const int64_t r_row = residual.strides(0), r_col = residual.strides(1);
  const int64_t u_row = update.strides(0), u_col = update.strides(1);
  const int64_t w_col = weight.strides(0);
  const float eps = eps_;
  cpu::dispatch_float(residual.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    enc.dispatch([rs = residual.data<T>(), us = update.data<T>(), ws = weight.data<T>(),
                  sums = outputs[0].data<T>(), normed = outputs[1].data<T>(), rows, width, r_row,
                  r_col, u_row, u_col, w_col, eps] {
      const int tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
      cpu::parallel_tasks<NoScratch>(tasks, int64_t{rows} * width, [&](int task, NoScratch&) {
        const int end = std::min(rows, (task + 1) * kRowsPerTask);
        for (int row = task * kRowsPerTask; row < end; ++row) {
          T* sum = sums + int64_t{row} * width;
          float squares = 0.0f;
          for (int i = 0; i < width; ++i) {
            sum[i] = cpu::from_float<T>(cpu::to_float(rs[row * r_row + i * r_col]) +
                                        cpu::to_float(us[row * u_row + i * u_col]));
            const float x = cpu::to_float(sum[i]);
            squares += x * x;
          }
          const float scale = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
          T* out = normed + int64_t{row} * width;
          for (int i = 0; i < width; ++i) {
            out[i] = cpu::from_float<T>(cpu::to_float(sum[i]) * scale *
                                        cpu::to_float(ws[i * w_col]));
          }
        }
      });
    });
  });
}

}  // namespace pagekernels
