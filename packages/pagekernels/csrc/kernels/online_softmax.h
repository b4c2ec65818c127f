// Online-softmax state shared by every attention kernel (paged or dense, CPU or CUDA), so the
// kernels differ only in how they address K/V.
//
// State per query row: running max m (of scaled logits, base-2 domain), running sum d, and an
// unnormalised output accumulator o (held by the caller). Scores are fp32.
#pragma once

#include <cmath>

#include "portability.h"

namespace pagekernels {

constexpr float kLog2e = 1.4426950408889634f;

struct SoftmaxState {
  float m;  // running max of s * scale * log2(e); -INFINITY when nothing seen
  float d;  // running sum of exp2(s' - m)

  PK_HOST_DEVICE static SoftmaxState empty() { return {-INFINITY, 0.0f}; }

  // Absorb a new maximum `m_new` (>= m); returns the factor the caller multiplies o and d by.
  PK_HOST_DEVICE float rescale_to(float m_new) {
    float alpha = (m == -INFINITY) ? 0.0f : exp2f(m - m_new);
    d *= alpha;
    m = m_new;
    return alpha;
  }
};

// Merge partial state b into a (both unnormalised); returns the factors to apply to o_a and o_b:
// o = o_a * fa + o_b * fb. Empty partials (m == -inf) contribute nothing and never make NaN.
struct MergeFactors {
  float fa;
  float fb;
};

PK_HOST_DEVICE MergeFactors merge_states(SoftmaxState& a, const SoftmaxState& b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {1.0f, 0.0f};
  float fa = (a.m == -INFINITY) ? 0.0f : exp2f(a.m - m);
  float fb = (b.m == -INFINITY) ? 0.0f : exp2f(b.m - m);
  a.d = a.d * fa + b.d * fb;
  a.m = m;
  return {fa, fb};
}

// Final normalisation: 1/d, with an empty row (d == 0) giving 0 instead of NaN.
PK_HOST_DEVICE float inverse_sum(const SoftmaxState& s) { return s.d > 0.0f ? 1.0f / s.d : 0.0f; }

}  // namespace pagekernels
