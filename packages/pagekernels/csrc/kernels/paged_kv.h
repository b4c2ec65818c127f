// The one place where a logical K/V position becomes a physical address.
//
//   logical position -> logical page -> physical page id (block_table) -> slot in page
//
// Page storage is [P, H_kv, page_size, D], row-contiguous (FlashInfer's "HND"): one (page, head)
// holds page_size * D contiguous elements. Offsets are int64: a pool can exceed 2^31 elements.
// Raw pointers only; no MLX headers, so CPU (.cpp) and CUDA (.cu) kernels both include it.
#pragma once

#include <cstdint>

#include "portability.h"

namespace pagekernels {

struct PagedKVLayout {
  int64_t num_pages;  // P: physical pages in storage
  int num_kv_heads;   // H_kv
  int page_size;      // tokens per page
  int head_dim;       // D
  const int32_t* block_table;  // [B, max_pages], -1 = unused
  int max_pages;               // block_table row length

  // Physical page id of request b's logical page, or -1 if the entry is padding or out of
  // storage (kernels never read outside storage, even when handed garbage).
  PK_HOST_DEVICE int32_t page_id(int b, int logical_page) const {
    const int32_t p = table_entry(b, logical_page);
    return stored(p) ? p : -1;
  }

  // page_id in two steps, for kernels that keep the table load in flight until they use the
  // page: the raw entry (-1 past the row), then whether it names a page in storage.
  PK_HOST_DEVICE int32_t table_entry(int b, int logical_page) const {
    if (logical_page < 0 || logical_page >= max_pages) return -1;
    return block_table[static_cast<int64_t>(b) * max_pages + logical_page];
  }
  PK_HOST_DEVICE bool stored(int32_t page) const { return page >= 0 && page < num_pages; }

  // Element offset of (physical page, kv head, slot, 0) in a K or V page array.
  PK_HOST_DEVICE int64_t offset(int32_t page, int kv_head, int slot) const {
    return ((static_cast<int64_t>(page) * num_kv_heads + kv_head) * page_size + slot) *
           static_cast<int64_t>(head_dim);
  }

  // Element offset of logical token t of request b (kv head h), or -1 if unmapped.
  PK_HOST_DEVICE int64_t token_offset(int b, int kv_head, int t) const {
    int32_t p = page_id(b, t / page_size);
    return p < 0 ? -1 : offset(p, kv_head, t % page_size);
  }
};

// Slot numbering used by write_kv's slot_mapping: slot = page_id * page_size + offset.
PK_HOST_DEVICE int64_t slot_offset(int64_t slot, int page_size, int num_kv_heads, int kv_head,
                                   int head_dim) {
  int64_t page = slot / page_size;
  int64_t in_page = slot % page_size;
  return ((page * num_kv_heads + kv_head) * page_size + in_page) * head_dim;
}

// Causal masking, bottom-right aligned: query row l (0..L-1) of a request whose context holds
// context_len keys (including the L new ones) sees key s iff s <= l + context_len - L.
PK_HOST_DEVICE int causal_key_limit(int query_row, int query_len, int context_len) {
  return query_row + context_len - query_len + 1;  // exclusive bound on visible keys
}

}  // namespace pagekernels
