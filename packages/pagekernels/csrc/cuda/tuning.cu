// Process-wide kernel knobs declared in tuning.h.
#include <atomic>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cuda/tuning.h"

namespace pagekernels::cuda {

namespace {

std::atomic<int> g_decode_splits{0};
std::atomic<int> g_prefill_splits{0};
std::atomic<bool> g_decode_tensor_cores{true};
std::atomic<PrefillKernel> g_prefill_kernel{PrefillKernel::kAuto};

constexpr const char* kPrefillKernelNames[] = {"auto", "mma_sync", "wgmma"};

void check_splits(const char* name, int n) {
  if (n < 0) {
    throw std::invalid_argument(std::string("[") + name +
                                "] split count must be >= 0 (0 = automatic), got " +
                                std::to_string(n));
  }
}

}  // namespace

void set_decode_num_splits(int n) {
  check_splits("set_decode_num_splits", n);
  g_decode_splits = n;
}

int decode_num_splits() { return g_decode_splits; }

void set_prefill_num_splits(int n) {
  check_splits("set_prefill_num_splits", n);
  g_prefill_splits = n;
}

int prefill_num_splits() { return g_prefill_splits; }

void set_decode_tensor_cores(bool enabled) { g_decode_tensor_cores = enabled; }

bool decode_tensor_cores() { return g_decode_tensor_cores; }

void set_prefill_kernel(const std::string& name) {
  for (size_t i = 0; i < std::size(kPrefillKernelNames); ++i) {
    if (name == kPrefillKernelNames[i]) {
      g_prefill_kernel = static_cast<PrefillKernel>(i);
      return;
    }
  }
  throw std::invalid_argument("[set_prefill_kernel] expected one of auto, mma_sync, wgmma, got '" +
                              name + "'");
}

std::string prefill_kernel_name() {
  return kPrefillKernelNames[static_cast<int>(g_prefill_kernel.load())];
}

PrefillKernel prefill_kernel() { return g_prefill_kernel; }

}  // namespace pagekernels::cuda
