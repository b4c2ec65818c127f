// What the attention kernels (attention_simt.cuh, attention_mma.cuh, attention_wgmma.cuh) share:
// the kernel parameters, the work-item decomposition, per-row key limits and the output epilogue
// that writes either the final row or a split-K partial.
//
// Rows: the G = Hq / Hkv query heads of one kv head are packed with the L query positions into
// R = L * G rows, row r = l * G + g (query head kv_head * G + g, position l). A work item is a
// block of consecutive packed rows of one (b, kv_head) and one split (a contiguous key chunk):
// one CTA each, or a sequence of them per CTA in the persistent prefill kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/divisor.h"
#include "kernels/online_softmax.h"
#include "kernels/paged_kv.h"

namespace pagekernels::cuda {

// TMA descriptors of the K and V storage seen as [rows, D] matrices (row = element offset / D),
// for kernels that bulk-copy runs of consecutive rows (attention_wgmma): each copy moves
// box_rows rows x 64 columns into a 128-byte-swizzled column block. box_rows == 0: no maps.
struct KVTensorMaps {
  CUtensorMap k;
  CUtensorMap v;
  int box_rows;
};

template <typename T, typename KV>
struct AttentionParams {
  const T* q;             // [B, Hq, L, D]
  const T* k;             // key storage, addressed through kv
  const T* v;             // value storage, same layout as k
  T* out;                 // [B, Hq, L, D]; written when num_splits == 1
  float* partial_out;     // [B, Hq, L, num_splits, D] normalised partial rows (num_splits > 1)
  float* partial_lse;     // [B, Hq, L, num_splits] base-2 LSE of the scaled scores, -inf if empty
  KV kv;
  int batch;              // B
  int num_q_heads;        // Hq
  int num_kv_heads;       // Hkv
  Divisor group;          // G = Hq / Hkv (group.value), divided by as a multiply-high
  int query_len;          // L
  int head_dim;           // D (runtime; kernels are compiled for a capacity >= D)
  int num_row_blocks;     // blocks of packed rows per (b, kv_head)
  int num_splits;         // key chunks per (b, kv_head, row block)
  int chunk_keys;         // keys per chunk (multiple of the kernel's key tile)
  float scale_log2;       // softmax scale * log2(e)
  bool causal;            // bottom-right aligned to each request's key count
  KVTensorMaps tma;       // set for attention_wgmma when the storage allows bulk copies
};

struct WorkItem {
  int b;
  int kv_head;
  int row_block;
  int split;
};

// One CTA per work item: blockIdx.x = (b, kv_head, row block) with the row block fastest and
// reversed, so causal prefill starts the row blocks with the most keys first; blockIdx.y = split.
template <typename P>
__device__ __forceinline__ WorkItem work_item(const P& p) {
  int item = blockIdx.x;
  const int row_block = p.num_row_blocks - 1 - item % p.num_row_blocks;
  item /= p.num_row_blocks;
  return {item / p.num_kv_heads, item % p.num_kv_heads, row_block, static_cast<int>(blockIdx.y)};
}

// Work items of the persistent kernels, numbered longest first for causal prefill: the row
// block with the most keys for every (b, kv_head) and split, then the next row block. CTA c of
// G takes item c in round 0, then alternately G - 1 - c and c of each next round of G items
// (a snake), so the CTA that took the longest item of a round takes the shortest of the next.
struct PersistentSchedule {
  int num_items;

  template <typename P>
  __device__ __forceinline__ static int count(const P& p) {
    return p.batch * p.num_kv_heads * p.num_row_blocks * p.num_splits;
  }

  __device__ __forceinline__ int rounds() const {
    return (num_items + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  }

  // This CTA's item index in `round`, or -1 when the last round has none for it.
  __device__ __forceinline__ int item_index(int round) const {
    const int ctas = static_cast<int>(gridDim.x);
    const int cta = static_cast<int>(blockIdx.x);
    const int index = round * ctas + (round % 2 == 0 ? cta : ctas - 1 - cta);
    return index < num_items ? index : -1;
  }

  template <typename P>
  __device__ __forceinline__ static WorkItem item_at(const P& p, int index) {
    const int split = index % p.num_splits;
    index /= p.num_splits;
    const int heads = p.batch * p.num_kv_heads;
    const int bh = index % heads;
    return {bh / p.num_kv_heads, bh % p.num_kv_heads, p.num_row_blocks - 1 - index / heads, split};
  }
};

// Exclusive bound on the keys that query position l sees (same rule as the CPU kernels).
__device__ __forceinline__ int row_key_limit(int l, int query_len, int num_keys, bool causal) {
  const int limit = causal ? causal_key_limit(l, query_len, num_keys) : num_keys;
  return min(max(limit, 0), num_keys);
}

// Keys [begin, end) that a work item with packed rows [row_begin, row_end) visits in its split.
struct KeyRange {
  int begin;
  int end;        // <= begin when the item has nothing to do (it still writes an empty state)
  int all_rows;   // keys below this are visible to every row: no element mask needed
};

// First key of key chunk `split`.
template <typename P>
__device__ __forceinline__ int chunk_begin(const P& p, int split) {
  return split * p.chunk_keys;
}

template <typename P>
__device__ __forceinline__ KeyRange key_range(const P& p, int num_keys, int row_begin,
                                              int row_end, int split) {
  const int first_l = p.group.divide(row_begin);
  const int last_l = p.group.divide(row_end - 1);
  const int begin = chunk_begin(p, split);
  const int end = min(row_key_limit(last_l, p.query_len, num_keys, p.causal),
                      begin + p.chunk_keys);
  return {begin, end, row_key_limit(first_l, p.query_len, num_keys, p.causal)};
}

// What a work item covers: the item, its request's key count, its packed rows
// [row_begin, row_end) (a block of rows_per_cta) and the keys it visits.
struct CtaRows {
  WorkItem w;
  int num_keys;
  int row_begin;
  int row_end;
  KeyRange range;

  // Exclusive key bound of packed row r inside this CTA's key chunk; 0 for rows past the block.
  template <typename P>
  __device__ __forceinline__ int limit(const P& p, int r) const {
    return r < row_end
               ? min(row_key_limit(p.group.divide(r), p.query_len, num_keys, p.causal),
                     range.end)
               : 0;
  }
};

// The packed rows [begin, end) of work item w: its block of rows_per_cta (no global load).
struct RowSpan {
  int begin;
  int end;
};

template <typename P>
__device__ __forceinline__ RowSpan item_rows(const P& p, int rows_per_cta, const WorkItem& w) {
  const int begin = w.row_block * rows_per_cta;
  return {begin, min(begin + rows_per_cta, p.query_len * p.group.value)};
}

template <typename P>
__device__ __forceinline__ CtaRows cta_rows(const P& p, int rows_per_cta, const WorkItem& w,
                                            int num_keys) {
  const RowSpan rows = item_rows(p, rows_per_cta, w);
  return {w, num_keys, rows.begin, rows.end,
          key_range(p, num_keys, rows.begin, rows.end, w.split)};
}

template <typename P>
__device__ __forceinline__ CtaRows cta_rows(const P& p, int rows_per_cta, const WorkItem& w) {
  return cta_rows(p, rows_per_cta, w, p.kv.num_keys(w.b));
}

// Row index of (b, query head of packed row r, position of r) in q / out seen as [rows, D].
template <typename P>
__device__ __forceinline__ int64_t q_row_index(const P& p, int b, int kv_head, int r) {
  const int l = p.group.divide(r);
  const int64_t head = static_cast<int64_t>(kv_head) * p.group.value + (r - l * p.group.value);
  return (static_cast<int64_t>(b) * p.num_q_heads + head) * p.query_len + l;
}

// Element offset of (b, query head of packed row r, position of r, 0) in q / out.
template <typename P>
__device__ __forceinline__ int64_t q_row_offset(const P& p, int b, int kv_head, int r) {
  return q_row_index(p, b, kv_head, r) * p.head_dim;
}

// Where packed row r of work item w goes: its row of `out` when unsplit, else its slot of the
// fp32 partials (normalised row and LSE).
template <typename T>
struct RowOutput {
  T* out;          // row start in p.out, nullptr when split
  float* partial;  // row start in p.partial_out
  float* lse;      // the slot in p.partial_lse

  // The row's LSE in base 2 from its (m, d) (written once per row, split outputs only).
  __device__ __forceinline__ void store_lse(const SoftmaxState& state) const {
    *lse = state.d > 0.0f ? state.m + log2f(state.d) : -INFINITY;
  }
};

template <typename T, typename KV>
__device__ __forceinline__ RowOutput<T> row_output(const AttentionParams<T, KV>& p,
                                                   const WorkItem& w, int r) {
  const int64_t row = q_row_index(p, w.b, w.kv_head, r);
  if (p.num_splits == 1) return {p.out + row * p.head_dim, nullptr, nullptr};
  const int64_t slot = row * p.num_splits + w.split;
  return {nullptr, p.partial_out + slot * p.head_dim, p.partial_lse + slot};
}

// Writes dims [d0, d0 + N) of packed row r: o_unnormalised / d to out when unsplit, else the
// normalised fp32 partial (the thread with d0 == 0 also writes the row's LSE).
template <typename T, int N, typename P>
__device__ __forceinline__ void write_row(const P& p, const WorkItem& w, int r, int d0,
                                          float (&o)[N], const SoftmaxState& state) {
  const float inv = inverse_sum(state);
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] *= inv;
  const RowOutput<T> dst = row_output(p, w, r);
  if (dst.out != nullptr) {
    store_float<T>(dst.out + d0, o);
    return;
  }
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    *reinterpret_cast<float4*>(dst.partial + d0 + i) =
        make_float4(o[i], o[i + 1], o[i + 2], o[i + 3]);
  }
  if (d0 == 0) dst.store_lse(state);
}

}  // namespace pagekernels::cuda
