// eval_gpu helpers: early return for empty outputs and the error of a CPU-only build.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"

#ifdef PAGEKERNELS_WITH_CUDA
#include "cuda/launch.h"
#endif

namespace pagekernels {

namespace mx = mlx::core;

// True (and every output given an empty buffer) when there is nothing to compute.
inline bool all_outputs_empty(std::vector<mx::array>& outputs) {
  for (auto& out : outputs) {
    if (out.size() != 0) return false;
  }
  for (auto& out : outputs) out.set_data(mx::allocator::malloc(0));
  return true;
}

[[noreturn]] inline void throw_no_gpu_kernels(std::string_view op) {
  throw std::runtime_error("[" + std::string(op) +
                           "] this build has no GPU kernels; rebuild with PAGEKERNELS_CUDA=1");
}

}  // namespace pagekernels
