// Split-K merge (design brief 2.3). Split s of a query row left a normalised fp32 partial row o_s
// and its base-2 LSE l_s; the row is  out = sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M),  M the
// largest l_s. Empty splits (l_s = -inf, o_s = 0) weigh nothing; a row whose splits are all
// empty becomes zeros.
//
// merge_rows spreads one row over (split group g, lane v) threads: lane v owns dims 4v..4v+3,
// group g takes splits g, g + G, g + 2G, ... and issues up to kBatch of their loads before
// using any, keeping its own (max, weight sum, acc); the G groups of a row then combine through
// shared memory. A row's S x D partial floats are so read by G x lanes threads at once (one or
// two L2 round trips), where one warp walking the splits paid one round trip per few splits.
// Two users: merge_splits_kernel (its own launch, for the prefill schedule) and the decode
// kernels' epilogue, where the last CTA of a (b, kv_head, row block) to finish merges its rows.
#pragma once

#include <cstdint>

#include "cuda/device_utils.cuh"
#include "kernels/online_softmax.h"

namespace pagekernels::cuda {

constexpr int kMergeThreads = 256;  // merge_splits_kernel's CTA
constexpr int kMergeBatch = 8;      // merge_splits_kernel: partial loads in flight per thread

// How merge_rows lays a CTA's threads over rows: tid = (row, group, lane), lane fastest.
struct MergeLayout {
  int lanes_log2;   // lanes per row: a power of two >= D / 4
  int groups_log2;  // split groups per row
  int rows;         // rows merged at once
};

__host__ __device__ inline int ceil_log2(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}

// Groups first: enough that each thread has at most `batch` splits (one round trip), as many as
// the lanes leave room for; then as many of `rows` as the remaining threads hold.
__host__ __device__ inline MergeLayout merge_layout(int threads, int rows, int num_splits,
                                                   int head_dim, int batch) {
  const int lanes_log2 = ceil_log2((head_dim + 3) / 4);
  const int row_slots_log2 = max(ceil_log2(threads + 1) - 1 - lanes_log2, 0);  // threads/lanes
  const int groups_log2 = min(ceil_log2((num_splits + batch - 1) / batch), row_slots_log2);
  return {lanes_log2, groups_log2, max(min(rows, 1 << (row_slots_log2 - groups_log2)), 1)};
}

// Loads at L2 (ld.global.cg): in the fused epilogue other CTAs wrote the partials moments ago.
// Volatile asm keeps the source order, so a batch's loads are all issued before the first use.
__device__ __forceinline__ float load_l2(const float* p) {
  float x;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(x) : "l"(p));
  return x;
}

__device__ __forceinline__ float4 load_l2(const float4* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}

// Merges rows [0, num_rows) of one CTA: local row i is row row_index(i) of partial_out
// [rows, num_splits, head_dim], partial_lse [rows, num_splits] and out [rows, head_dim].
// Every thread of the CTA (kThreads) must call it; `smem` holds kThreads * 6 floats.
template <typename T, int kThreads, int kBatch, typename RowIndex>
__device__ __forceinline__ void merge_rows(const float* partial_out, const float* partial_lse,
                                           T* out, int num_rows, int num_splits, int head_dim,
                                           RowIndex row_index, float* smem) {
  const MergeLayout layout = merge_layout(kThreads, num_rows, num_splits, head_dim, kBatch);
  const int tid = threadIdx.x;
  const int lane = tid & ((1 << layout.lanes_log2) - 1);
  const int groups = 1 << layout.groups_log2;
  const int group = (tid >> layout.lanes_log2) & (groups - 1);
  const int row_in_pass = tid >> (layout.lanes_log2 + layout.groups_log2);
  const int d0 = 4 * lane;
  float4* accs = reinterpret_cast<float4*>(smem);           // [kThreads]
  float2* stats = reinterpret_cast<float2*>(accs + kThreads);  // [kThreads]: (max, weight sum)

  for (int pass = 0; pass < num_rows; pass += layout.rows) {
    const int local_row = pass + row_in_pass;
    const bool row_valid = row_in_pass < layout.rows && local_row < num_rows;
    const bool dims_valid = row_valid && d0 < head_dim;
    const int64_t row = row_valid ? row_index(local_row) : 0;
    const float* lse = partial_lse + row * num_splits;
    // Loads stay in bounds without branches: lanes past D read dim 0 (never stored), splits
    // past the last read the last one with weight 0.
    const float* part = partial_out + row * num_splits * head_dim + (dims_valid ? d0 : 0);

    SoftmaxState state = SoftmaxState::empty();  // d = sum of weights relative to m
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = group; row_valid && s0 < num_splits; s0 += groups * kBatch) {
      float l[kBatch];
      float4 o[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int s = min(s0 + k * groups, num_splits - 1);
        l[k] = load_l2(lse + s);
        o[k] = load_l2(reinterpret_cast<const float4*>(part + int64_t{s} * head_dim));
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        if (s0 + k * groups >= num_splits) l[k] = -INFINITY;
      }
      float batch_max = l[0];
#pragma unroll
      for (int k = 1; k < kBatch; ++k) batch_max = fmaxf(batch_max, l[k]);
      const float m_new = fmaxf(state.m, batch_max);
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // nothing yet: every weight is 0
      const float alpha = exp2f(state.m - shift);
      state.d *= alpha;
      acc = make_float4(acc.x * alpha, acc.y * alpha, acc.z * alpha, acc.w * alpha);
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const float weight = exp2f(l[k] - shift);
        state.d += weight;
        acc.x = fmaf(weight, o[k].x, acc.x);
        acc.y = fmaf(weight, o[k].y, acc.y);
        acc.z = fmaf(weight, o[k].z, acc.z);
        acc.w = fmaf(weight, o[k].w, acc.w);
      }
      state.m = m_new;
    }

    // The row's groups combine at the thread of group 0 with the same lane.
    accs[tid] = acc;
    stats[tid] = make_float2(state.m, state.d);
    __syncthreads();
    if (dims_valid && group == 0) {
      float total[4] = {acc.x, acc.y, acc.z, acc.w};
      for (int g = 1; g < groups; ++g) {
        const int other = tid + (g << layout.lanes_log2);
        const float2 st = stats[other];
        const MergeFactors f = merge_states(state, {st.x, st.y});
        const float4 a = accs[other];
        total[0] = total[0] * f.fa + a.x * f.fb;
        total[1] = total[1] * f.fa + a.y * f.fb;
        total[2] = total[2] * f.fa + a.z * f.fb;
        total[3] = total[3] * f.fa + a.w * f.fb;
      }
      const float inv = inverse_sum(state);
#pragma unroll
      for (int e = 0; e < 4; ++e) total[e] *= inv;
      store_float<T>(out + row * head_dim + d0, total);
    }
    __syncthreads();  // smem is reused by the next pass (or by the caller)
  }
}

// One CTA merges layout.rows consecutive rows [blockIdx.x * rows_per_cta, ...).
template <typename T>
__global__ void __launch_bounds__(kMergeThreads, 1)
    merge_splits_kernel(const float* partial_out, const float* partial_lse, T* out, int64_t rows,
                        int num_splits, int head_dim, int rows_per_cta) {
  __shared__ __align__(16) float smem[kMergeThreads * 6];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_cta;
  const int count = static_cast<int>(rows - first < rows_per_cta ? rows - first : rows_per_cta);
  merge_rows<T, kMergeThreads, kMergeBatch>(partial_out, partial_lse, out, count, num_splits,
                                            head_dim, [first](int i) { return first + i; }, smem);
}

// Zeroes the fused merge's arrival counters (attention_common.cuh, merge_if_last). Internal
// linkage: this header is compiled into both paged_attention.cu and dense_attention.cu.
namespace {
__global__ void zero_counters_kernel(unsigned* counters, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) counters[i] = 0;
}
}  // namespace

}  // namespace pagekernels::cuda
