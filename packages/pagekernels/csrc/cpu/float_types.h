// Storage types of the CPU kernels and their float32 conversions. Raw bits only (no MLX
// headers), written so that loops over a row auto-vectorise without -march or -ffast-math.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pagekernels::cpu {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bits_to_float(static_cast<uint32_t>(x.bits) << 16); }

// Branch-free half -> float: shift exponent+mantissa into place and rescale by 2^112, which also
// turns half subnormals into float normals exactly; inf/NaN get the full float exponent.
inline float to_float(f16 x) {
  uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t magnitude = x.bits & 0x7fffu;
  float f = bits_to_float(magnitude << 13) * 0x1.0p112f;
  uint32_t u = float_to_bits(f);
  if (magnitude >= 0x7c00u) u |= 0x7f800000u;
  return bits_to_float(u | sign);
}

template <typename T>
T from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}

// Round to nearest even; NaN stays NaN (quiet bit set so truncation cannot make it inf).
template <>
inline bf16 from_float<bf16>(float x) {
  uint32_t u = float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

// Round to nearest even, with overflow to inf and gradual underflow to half subnormals
// (F. Giesen's float_to_half_fast3_rtne).
template <>
inline f16 from_float<f16>(float x) {
  uint32_t u = float_to_bits(x);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x47800000u) {  // >= 2^16: inf, or NaN (kept quiet)
    return {static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  }
  if (a < 0x38800000u) {  // below 2^-14: subnormal or zero
    // Adding 0.5 makes the FPU round the value to a multiple of 2^-24 (the subnormal step).
    float shifted = bits_to_float(a) + 0.5f;
    return {static_cast<uint16_t>(sign | (float_to_bits(shifted) - float_to_bits(0.5f)))};
  }
  uint32_t mantissa_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mantissa_odd;  // rebias exponent (-112 << 23) and round
  return {static_cast<uint16_t>(sign | (a >> 13))};
}

// dst[i] = float(src[i]) for a row of n elements.
template <typename T>
inline void row_to_float(const T* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

}  // namespace pagekernels::cpu
