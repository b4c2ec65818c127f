// Linear::eval_cpu: x [M, K] @ weight [N, K]^T with fp32 accumulation, one task per block of
// output columns (each weight row is read once, as on the GPU), column n written to the output
// part it falls in. Inputs may be strided views.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/dispatch.h"
#include "cpu/parallel.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr int kColumnsPerTask = 64;

struct NoScratch {};

}  // namespace

void Linear::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& x = inputs[0];
  const auto& weight = inputs[1];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);
  const int rows = x.shape(0);
  const int depth = x.shape(1);
  const int columns = weight.shape(0);
  const int64_t x_row = x.strides(0), x_col = x.strides(1);
  const int64_t w_row = weight.strides(0), w_col = weight.strides(1);
  cpu::dispatch_float(x.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T*> parts;
    std::vector<int> starts{0};  // part i holds columns starts[i] .. starts[i + 1] - 1
    for (auto& out : outputs) {
      parts.push_back(out.data<T>());
      starts.push_back(starts.back() + out.shape(1));
    }
    enc.dispatch([xs = x.data<T>(), ws = weight.data<T>(), parts = std::move(parts),
                  starts = std::move(starts), rows, depth, columns, x_row, x_col, w_row, w_col] {
      const int tasks = (columns + kColumnsPerTask - 1) / kColumnsPerTask;
      const int64_t work = int64_t{rows} * depth * columns;
      cpu::parallel_tasks<NoScratch>(tasks, work, [&](int task, NoScratch&) {
        const int end = std::min(columns, (task + 1) * kColumnsPerTask);
        for (int n = task * kColumnsPerTask; n < end; ++n) {
          const auto part = std::upper_bound(starts.begin(), starts.end(), n) - starts.begin() - 1;
          const int width = starts[part + 1] - starts[part];
          T* ys = parts[part] + (n - starts[part]);
          const T* w = ws + n * w_row;
          for (int m = 0; m < rows; ++m) {
            const T* xr = xs + m * x_row;
            float sum = 0.0f;
            for (int k = 0; k < depth; ++k) {
              sum += cpu::to_float(xr[k * x_col]) * cpu::to_float(w[k * w_col]);
            }
            ys[int64_t{m} * width] = cpu::from_float<T>(sum);
          }
        }
      });
    });
  });
}

}  // namespace pagekernels
