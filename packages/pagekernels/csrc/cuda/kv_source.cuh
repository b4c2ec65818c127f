// Addressing policies for the attention kernels: where key/value row t of request b lives.
// The kernels are templated on one of these, so paged and dense attention share every line of
// kernel code except this address calculation (the paged one is PagedKVLayout, the single
// address function of csrc/kernels/paged_kv.h).
//
// A lookup happens in two steps so kernels can overlap the table load with other work:
//   locate(b, t) -> KVRow (issues the block_table load)  ...  offset(row, h) -> element offset.
// Nothing reads the loaded entry before offset(): a check in locate() would make the thread
// wait for the load right there.
// offset() returns -1 for rows that are padding or outside storage: kernels zero-fill those and
// mask their scores, and never dereference them.
#pragma once

#include <cstdint>

#include "kernels/paged_kv.h"

namespace pagekernels::cuda {

struct KVRow {
  // Physical page (paged: the block_table entry as loaded, validated only by offset(), so
  // the load stays in flight until then; outside [0, num_pages) = unmapped) or batch row
  // (dense; -1 = past the sequence).
  int32_t page;
  int slot;  // position inside the page
};

struct PagedKV {
  PagedKVLayout layout;        // pools [P, Hkv, page_size, D] and block_table [B, max_pages]
  const int32_t* context_lens;  // [B]

  // num_keys(b) == keys(length(b)); kernels that load a request's length early call the two
  // apart, so nothing waits for the load until the count is needed.
  __device__ __forceinline__ int32_t length(int b) const { return context_lens[b]; }
  __device__ __forceinline__ int keys(int32_t length) const { return max(length, 0); }
  __device__ __forceinline__ int num_keys(int b) const { return keys(length(b)); }

  __device__ __forceinline__ KVRow locate(int b, int t) const {
    const int logical_page = t / layout.page_size;
    return {layout.table_entry(b, logical_page), t - logical_page * layout.page_size};
  }

  __device__ __forceinline__ int64_t offset(KVRow row, int kv_head) const {
    return layout.stored(row.page) ? layout.offset(row.page, kv_head, row.slot) : -1;
  }
};

// Dense [B, Hkv, S, D] keys: request b is one "page" of S rows.
struct DenseKV {
  int num_kv_heads;
  int seq_len;  // S
  int head_dim;
  const int32_t* key_lens;  // [B]

  __device__ __forceinline__ int32_t length(int b) const { return key_lens[b]; }
  __device__ __forceinline__ int keys(int32_t length) const { return min(max(length, 0), seq_len); }
  __device__ __forceinline__ int num_keys(int b) const { return keys(length(b)); }

  __device__ __forceinline__ KVRow locate(int b, int t) const {
    return {t < seq_len ? b : -1, t};
  }

  __device__ __forceinline__ int64_t offset(KVRow row, int kv_head) const {
    if (row.page < 0) return -1;
    return ((static_cast<int64_t>(row.page) * num_kv_heads + kv_head) * seq_len + row.slot) *
           static_cast<int64_t>(head_dim);
  }
};

}  // namespace pagekernels::cuda
