// Knobs for tests and benchmarks of the CUDA kernels (process-wide, thread-safe).
// Plain C++ so bindings.cpp can include it; defined in tuning.cu. Defaults are production values.
#pragma once

#include <string>

namespace pagekernels::cuda {

// Split-K chunks of the decode schedule (L <= 8): 0 = automatic (split_plan.h), n > 0 = n
// chunks, clamped to the number of chunks the keys allow. Throws std::invalid_argument if n < 0.
void set_decode_num_splits(int n);
int decode_num_splits();

// Same for the prefill schedule (L > 8).
void set_prefill_num_splits(int n);
int prefill_num_splits();

// Decode on tensor cores (float16/bfloat16, D = 64 or 128); false forces the CUDA-core kernel,
// which every other dtype and head dim uses anyway. Default true.
void set_decode_tensor_cores(bool enabled);
bool decode_tensor_cores();

// Which kernel runs the prefill schedule's 128-row tiles (float16/bfloat16, D = 128):
//   "auto"      the fastest measured (docs/performance.md), the default: wgmma where possible;
//   "mma_sync"  attention_mma (any sm_80+ GPU);
//   "wgmma"     attention_wgmma (sm_90 only, else mma_sync).
// Throws std::invalid_argument for any other name.
enum class PrefillKernel { kAuto, kMmaSync, kWgmma };
void set_prefill_kernel(const std::string& name);
std::string prefill_kernel_name();
PrefillKernel prefill_kernel();

}  // namespace pagekernels::cuda
