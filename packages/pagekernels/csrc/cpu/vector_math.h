// Inner loops of the CPU attention kernel, written so that the compiler vectorises them at -O3
// without -ffast-math (no reassociation needed, no libm calls).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/float_types.h"

namespace pagekernels::cpu {

// Head dims 64 and 128 get compile-time loop bounds; kD == 0 is the generic runtime-D path.
template <int kD>
inline int dim(int runtime_dim) {
  return kD > 0 ? kD : runtime_dim;
}

// q . k with independent partial sums, so the compiler vectorises it without reassociating
// (no -ffast-math).
template <int kD>
inline float dot(const float* q, const float* k, int runtime_dim) {
  constexpr int kLanes = 16;
  const int n = dim<kD>(runtime_dim);
  float partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int w = 0; w < kLanes; ++w) partial[w] += q[i + w] * k[i + w];
  }
  float sum = 0.0f;
  for (int w = 0; w < kLanes; ++w) sum += partial[w];
  for (; i < n; ++i) sum += q[i] * k[i];
  return sum;
}

// Scores of one query row against four key rows.
template <int kD>
inline void dot4(const float* q, const float* const* k, int runtime_dim, float* scores) {
  for (int c = 0; c < 4; ++c) scores[c] = dot<kD>(q, k[c], runtime_dim);
}

// acc += sum_j weights[j] * v[j] over four value rows: one load/store of acc per four keys.
template <int kD>
inline void axpy4(float* acc, const float* weights, const float* const* v, int runtime_dim) {
  const int n = dim<kD>(runtime_dim);
  const float w0 = weights[0], w1 = weights[1], w2 = weights[2], w3 = weights[3];
  const float *v0 = v[0], *v1 = v[1], *v2 = v[2], *v3 = v[3];
  for (int e = 0; e < n; ++e) acc[e] += (w0 * v0[e] + w1 * v1[e]) + (w2 * v2[e] + w3 * v3[e]);
}

// 2^x for x <= 0, relative error below 2e-7 (Taylor series on the reduced argument). Unlike
// exp2f it is inlined and vectorises. Arguments below -126, -inf included, give 2^-126: callers
// mask those out (see exp2_weights).
inline float exp2_nonpositive(float x) {
  // Clamp on the bit pattern: for x <= 0 a larger pattern is a more negative number, and an
  // integer select vectorises where a float compare would not (GCC's default -ftrapping-math).
  const uint32_t u = float_to_bits(x);
  x = bits_to_float(u > float_to_bits(-126.0f) ? float_to_bits(-126.0f) : u);
  const int n = static_cast<int>(x - 0.5f);  // truncation: x - n lies in [-0.5, 0.5]
  const float f = (x - static_cast<float>(n)) * 0.6931471805599453f;  // ln 2 * fraction
  float p = 1.0f / 5040.0f;  // e^f, Horner, degree 7
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  return p * bits_to_float(static_cast<uint32_t>(n + 127) << 23);
}

// weights[j] = 2^(scores[j] - max) for j < live, 0 for j >= live and for -inf scores; n entries.
inline void exp2_weights(const float* scores, float max, int live, int n, float* weights) {
  const uint32_t minus_inf = float_to_bits(-INFINITY);
  for (int j = 0; j < n; ++j) {
    const uint32_t keep = (j < live) & (float_to_bits(scores[j]) != minus_inf);
    weights[j] = bits_to_float(float_to_bits(exp2_nonpositive(scores[j] - max)) & (0u - keep));
  }
}

}  // namespace pagekernels::cpu
