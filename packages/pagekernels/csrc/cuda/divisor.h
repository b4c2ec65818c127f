// Division by a divisor fixed at launch (the query heads per KV head): a multiply-high and a
// shift instead of the ~20-instruction integer division, whose MUFU.RCP chain sat on the
// attention epilogue's and item prologue's paths. Exact for dividends in [0, 2^31)
// (Granlund and Montgomery's round-up method, with l = ceil(log2 d)):
//   m = ceil(2^(31 + l) / d) < 2^32,  n / d = floor(n m / 2^(31 + l)) = umulhi(n, m) >> (l - 1).
#pragma once

#include <cstdint>
#include <stdexcept>

namespace pagekernels::cuda {

struct Divisor {
  int value;            // d >= 1
  uint32_t multiplier;  // m (unused for d = 1)
  int shift;            // l - 1

  static Divisor of(int d) {
    if (d < 1) throw std::invalid_argument("Divisor: expected a divisor >= 1");
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    if (l == 0) return {1, 0, 0};
    const uint64_t m = ((uint64_t{1} << (31 + l)) + static_cast<uint64_t>(d) - 1) / d;
    return {d, static_cast<uint32_t>(m), l - 1};
  }

  // n / d for 0 <= n < 2^31.
  __host__ __device__ __forceinline__ int divide(int n) const {
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(static_cast<uint32_t>(n), multiplier);
#else
    const auto high = static_cast<uint32_t>((uint64_t{static_cast<uint32_t>(n)} * multiplier) >> 32);
#endif
    return value == 1 ? n : static_cast<int>(high >> shift);
  }
};

}  // namespace pagekernels::cuda
