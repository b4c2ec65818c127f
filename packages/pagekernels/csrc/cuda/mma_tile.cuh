// Per-tile math shared by the tensor-core attention kernels (attention_mma.cuh on mma.sync,
// attention_wgmma.cuh on wgmma). Both hold scores and outputs in the m16n8 accumulator layout:
// for one 16-row tile, block n element e of lane (g = lane / 4, c = lane % 4) is row
// g + 8 * (e / 2), column 8n + 2c + (e % 2). Rows g and g + 8 are this lane's "h = 0" and "h = 1".
#pragma once

#include <cstdint>

#include "cuda/attention_common.cuh"
#include "cuda/device_utils.cuh"

namespace pagekernels::cuda {

// The softmax helpers below assume c = scale * log2(e) > 0. A negative scale is folded into Q as
// a sign flip and a zero scale as zeros (both exact in 16-bit floats, fold_scale_sign); the
// softmax then runs with c = |c| (or 1).
__device__ __forceinline__ float positive_scale(float scale_log2) {
  return scale_log2 > 0.0f ? scale_log2 : (scale_log2 < 0.0f ? -scale_log2 : 1.0f);
}

// Folds the sign of a scale <= 0 into a 16-bit Q tile of `elems` elements in shared memory
// (threads 0 .. kThreads - 1 call it; the caller puts barriers around it).
template <int kThreads, typename T>
__device__ __forceinline__ void fold_scale_sign(T* q_tile, int elems, float scale_log2) {
  const uint32_t flip = scale_log2 < 0.0f ? 0x80008000u : 0u;
  const uint32_t keep = scale_log2 < 0.0f ? 0xffffffffu : 0u;
  uint32_t* words = reinterpret_cast<uint32_t*>(q_tile);
  for (int i = static_cast<int>(threadIdx.x); i < elems / 2; i += kThreads) {
    words[i] = (words[i] ^ flip) & keep;
  }
}

// Copies the CTA's kRows packed query rows (zero rows past row_end) into q_tile as one
// cp.async group; position(row, chunk) is where 16-byte chunk `chunk` of a row goes.
template <int kRows, int kHeadDim, int kThreads, typename T, typename P, typename Position>
__device__ __forceinline__ void load_q_tile(const P& p, const CtaRows& cta, T* q_tile,
                                            Position position) {
  constexpr int kChunks = kHeadDim / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kChunks; i += kThreads) {
    const int row = i / kChunks;
    const int chunk = i % kChunks;
    const int r = cta.row_begin + row;
    const bool valid = r < cta.row_end;
    const T* src = valid ? p.q + q_row_offset(p, cta.w.b, cta.w.kv_head, r) + chunk * 8 : p.q;
    cp_async_16(q_tile + position(row, chunk), src, valid);
  }
  cp_async_commit();
}

// Masks the scores of keys key0 + [0, 8 * kBlocks) of a tile starting at key t0: a key drops out
// when its page is unmapped (mapped(key) is false, key counted from t0) or it is at or past its
// row's limit.
template <int kBlocks, typename Mapped>
__device__ __forceinline__ void mask_scores(float (&s)[kBlocks][4], Mapped mapped, int key0,
                                            int t0, const int (&limit)[2], int lane) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + n * 8 + 2 * (lane & 3) + (e & 1);
      if (!(mapped(key) && t0 + key < limit[e / 2])) s[n][e] = -INFINITY;
    }
  }
}

// The largest score of row h (0: this lane's row g, 1: row g + 8) across the lane's quad, from
// `init`; two independent chains (with two warps per scheduler, a serial chain of kBlocks
// dependent FMNMX costs more than the instructions themselves).
template <int kBlocks>
__device__ __forceinline__ float row_max(const float (&s)[kBlocks][4], int h, float init) {
  float partial_max[2] = {init, init};
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
    partial_max[n % 2] = fmaxf(partial_max[n % 2], fmaxf(s[n][2 * h], s[n][2 * h + 1]));
  }
  return group_max<4>(fmaxf(partial_max[0], partial_max[1]));
}

// Turns row h of s into p = 2^(c s - m) and returns `carry` plus this lane's sum of them (two
// chains, as in row_max).
template <int kBlocks>
__device__ __forceinline__ float exponentiate_row(float (&s)[kBlocks][4], int h, float c, float m,
                                                  float carry) {
  float partial_sum[2] = {carry, 0.0f};
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
    for (int e = 2 * h; e < 2 * h + 2; ++e) {
      s[n][e] = fast_exp2(fmaf(s[n][e], c, -m));
      partial_sum[n % 2] += s[n][e];
    }
  }
  return partial_sum[0] + partial_sum[1];
}

// One online-softmax step in the exp2 domain (c = scale * log2(e) > 0) for rows h = 0, 1:
// updates the running max m and sum d, turns s into p = 2^(c s - m) and returns in alpha the
// factor by which the rows' outputs must be rescaled (rescale_rows).
template <int kBlocks>
__device__ __forceinline__ void softmax_scores(float (&s)[kBlocks][4], float (&m)[2],
                                               float (&d)[2], float c, float (&alpha)[2]) {
  static_assert(kBlocks % 2 == 0, "pairs of score blocks");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m[h], row_max(s, h, -INFINITY) * c);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: p = 0
    alpha[h] = fast_exp2(m[h] - m_use);
    m[h] = m_new;
    d[h] = exponentiate_row(s, h, c, m_use, d[h] * alpha[h]);
  }
}

// Multiplies rows h = 0, 1 of an accumulator-layout tile (outputs, or probabilities) by alpha.
template <int kOutBlocks>
__device__ __forceinline__ void rescale_rows(float (&o)[kOutBlocks][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < kOutBlocks; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
  }
}

// What softmax_scores_lazy_max did to a tile.
enum class LazyMax { kKept, kMoved, kOverflow };

// The online softmax step for tiles after a row's first (m finite), without a max in the common
// case: p = 2^(c s - m) against the max m the rows already have (FlashAttention-4's lazy
// rescale: the 16-bit P and the fp32 sums hold values up to 2^8 without loss). Every p of a
// thread is at most the thread's sum, so while each thread's sums stay <= 2^8 no row outgrew
// its max by that margin: kKept, d updated, O untouched, and no max or shuffle was needed.
// Otherwise each row whose largest p (a quad max) passes 2^8 takes it as its new max: the row's
// p and sum are scaled down by it and O must be too (kMoved, factors in alpha, 1 for the other
// rows). kOverflow, with m, d and alpha untouched, when some p reached 2^64 or overflowed to
// inf: s, now holding p, must be recomputed and go through softmax_scores. (NaN scores, from
// NaN or inf inputs, reach d as they do in softmax_scores.) `use_p()` runs where p is final for
// kKept and kMoved: right after the exponentials, before the vote, so the compiler can
// interleave its work with them (speculative: kKept is the common case), and again after
// kMoved's rescale.
constexpr float kLazyMaxMargin = 256.0f;    // 2^8
constexpr float kLazyMaxOverflow = 1.8e19f;  // ~2^64: d plus 32 such p stay finite

template <int kBlocks, typename UseP>
__device__ __forceinline__ LazyMax softmax_scores_lazy_max(float (&s)[kBlocks][4], float (&m)[2],
                                                           float (&d)[2], float c,
                                                           float (&alpha)[2], UseP use_p) {
  const float sum[2] = {exponentiate_row(s, 0, c, m[0], 0.0f),
                        exponentiate_row(s, 1, c, m[1], 0.0f)};
  use_p();
  if (!__any_sync(0xffffffffu, sum[0] > kLazyMaxMargin || sum[1] > kLazyMaxMargin)) {
    d[0] += sum[0];
    d[1] += sum[1];
    return LazyMax::kKept;
  }
  const float top[2] = {row_max(s, 0, 0.0f), row_max(s, 1, 0.0f)};  // p >= 0
  if (__any_sync(0xffffffffu, !(top[0] < kLazyMaxOverflow && top[1] < kLazyMaxOverflow))) {
    return LazyMax::kOverflow;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float shift = top[h] > kLazyMaxMargin ? fast_log2(top[h]) : 0.0f;
    m[h] += shift;
    alpha[h] = fast_exp2(-shift);
    d[h] = (d[h] + sum[h]) * alpha[h];
  }
  rescale_rows(s, alpha);
  use_p();
  return LazyMax::kMoved;
}

// The probabilities of keys 16 kb .. 16 kb + 15 as the A fragment of P V (they are exactly one).
template <typename T, int kBlocks>
__device__ __forceinline__ void probabilities_fragment(const float (&s)[kBlocks][4], int kb,
                                                       uint32_t (&a)[4]) {
  a[0] = pack2<T>(s[2 * kb][0], s[2 * kb][1]);
  a[1] = pack2<T>(s[2 * kb][2], s[2 * kb][3]);
  a[2] = pack2<T>(s[2 * kb + 1][0], s[2 * kb + 1][1]);
  a[3] = pack2<T>(s[2 * kb + 1][2], s[2 * kb + 1][3]);
}

// Transposes, within each quad (the 4 lanes q of one accumulator row), the row's packed column
// pairs of 8-column blocks 4k .. 4k + 3: lane q starts with pair q of each block (a[j] = block
// 4k + j) and ends with block 4k + q whole (a[j] = pair j), ready for one 16-byte store. Two
// butterfly stages of two shuffles each; every lane of the warp must take part.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int q) {
  const bool odd = q & 1;  // stage 1: even lanes trade slots 1 and 3, odd lanes 0 and 2
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? a[2 * i] : a[2 * i + 1], 1);
    if (odd) {
      a[2 * i] = got;
    } else {
      a[2 * i + 1] = got;
    }
  }
  const bool high = q & 2;  // stage 2: lanes 0 and 1 trade slots 2 and 3, lanes 2 and 3 0 and 1
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, high ? a[i] : a[2 + i], 2);
    if (high) {
      a[i] = got;
    } else {
      a[2 + i] = got;
    }
  }
}

// Epilogue straight from the accumulators, for kernels whose shared memory is busy past the main
// loop: this lane's rows g and g + 8 of one 16-row tile (packed rows r0 + lane / 4 + 8 h) as
// O / d. Unsplit 16-bit outputs go as 16-byte stores (quad_transpose: a quarter of the store
// instructions, full sectors); fp32 partials as 8-byte stores of two columns per 8-column block.
template <typename T, int kOutBlocks, typename KV>
__device__ __forceinline__ void store_fragment_rows(const AttentionParams<T, KV>& p,
                                                    const CtaRows& cta, int r0,
                                                    const float (&o)[kOutBlocks][4],
                                                    const float (&m)[2], const float (&d)[2],
                                                    int lane) {
  // Uniform: the output's base is 16-byte aligned (rows are head_dim * 2 bytes apart).
  const bool vector_store = kOutBlocks % 4 == 0 && p.num_splits == 1 &&
                            reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.head_dim % 8 == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const SoftmaxState state{m[h], group_sum<4>(d[h])};
    const int r = r0 + lane / 4 + 8 * h;
    const float inv = inverse_sum(state);
    if (vector_store) {
      T* out = p.out + q_row_offset(p, cta.w.b, cta.w.kv_head, r);
      const int q = lane % 4;
#pragma unroll
      for (int k = 0; k < kOutBlocks / 4; ++k) {
        uint32_t a[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a[j] = pack2<T>(o[4 * k + j][2 * h] * inv, o[4 * k + j][2 * h + 1] * inv);
        }
        quad_transpose(a, q);  // before the row check: the whole warp shuffles
        if (r < cta.row_end) {
          *reinterpret_cast<uint4*>(out + 8 * (4 * k + q)) = make_uint4(a[0], a[1], a[2], a[3]);
        }
      }
      continue;
    }
    if (r >= cta.row_end) continue;
    const RowOutput<T> dst = row_output(p, cta.w, r);
    const int col = 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < kOutBlocks; ++n) {
      const float lo = o[n][2 * h] * inv;
      const float hi = o[n][2 * h + 1] * inv;
      if (dst.out != nullptr) {
        *reinterpret_cast<uint32_t*>(dst.out + 8 * n + col) = pack2<T>(lo, hi);
      } else {
        *reinterpret_cast<float2*>(dst.partial + 8 * n + col) = make_float2(lo, hi);
      }
    }
    if (dst.out == nullptr && lane % 4 == 0) dst.store_lse(state);
  }
}

// Epilogue, step 1: parks this lane's (m, d, O) of one 16-row tile whose row g has slot `slot0`
// in fp32 scratch ([slots][kOutStride]) and stats ([slots][2]).
template <int kOutBlocks, int kOutStride>
__device__ __forceinline__ void park_rows(float* scratch, float* stats, int slot0,
                                          const float (&o)[kOutBlocks][4], const float (&m)[2],
                                          const float (&d)[2], int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float row_sum = group_sum<4>(d[h]);
    const int slot = slot0 + lane / 4 + 8 * h;
    float* dst = scratch + slot * kOutStride + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < kOutBlocks; ++n) {
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
    }
    if (lane % 4 == 0) {
      stats[2 * slot] = m[h];
      stats[2 * slot + 1] = row_sum;
    }
  }
}

// Epilogue, step 2 (after a barrier): the CTA merges the kParts parked states of each of its
// kRows rows (slot part * kRows + row) and writes 8 dims per thread and step.
template <typename T, int kHeadDim, int kRows, int kParts, int kOutStride, int kThreads,
          typename P>
__device__ __forceinline__ void write_parked_rows(const P& p, const WorkItem& w, int row_begin,
                                                  int row_end, const float* scratch,
                                                  const float* stats) {
  constexpr int kRowChunks = kHeadDim / 8;
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kRowChunks; i += kThreads) {
    const int row = i / kRowChunks;
    const int d0 = (i % kRowChunks) * 8;
    if (row_begin + row >= row_end) continue;
    SoftmaxState state{stats[2 * row], stats[2 * row + 1]};
    float acc[8];
    const float* src = scratch + row * kOutStride + d0;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = src[e];
    for (int part = 1; part < kParts; ++part) {
      const int other = part * kRows + row;
      const MergeFactors f = merge_states(state, {stats[2 * other], stats[2 * other + 1]});
      const float* ob = scratch + other * kOutStride + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = acc[e] * f.fa + ob[e] * f.fb;
    }
    write_row<T>(p, w, row_begin + row, d0, acc, state);
  }
}

}  // namespace pagekernels::cuda
