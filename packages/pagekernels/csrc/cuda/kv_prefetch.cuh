// L1 prefetch of the block_table entries that kv.locate(b, t) will read for a run of keys.
//
// PagedKV::locate loads a table entry and range-checks it in one expression, so a run of
// lookups compiles to load, use, load, use: each lookup pays its own round trip (the decode
// prologue's seven lookups were ~4 dependent round trips, ptxas keeping about two in flight).
// Prefetching the run's table lines first puts them in flight at once; the lookups then hit L1.
#pragma once

#include <cstdint>

#include "cuda/kv_source.cuh"

namespace pagekernels::cuda {

// Thread i prefetches the i-th 64-byte step of the entries of keys [first_key, first_key +
// keys) of row b (two steps per 128-byte line, so a line is never skipped when the table is
// not line-aligned).
__device__ __forceinline__ void prefetch_lookups(const PagedKV& kv, int b, int first_key,
                                                 int keys) {
  constexpr int kEntriesPerStep = 64 / sizeof(int32_t);
  const PagedKVLayout& l = kv.layout;
  if (keys <= 0) return;
  const int64_t row = static_cast<int64_t>(b) * l.max_pages;
  const int64_t first = row + first_key / l.page_size;
  const int64_t last = row + min((first_key + keys - 1) / l.page_size, l.max_pages - 1);
  const int64_t entry = first / kEntriesPerStep * kEntriesPerStep +
                        static_cast<int64_t>(threadIdx.x) * kEntriesPerStep;
  if (entry <= last) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(l.block_table + entry));
}

// Dense rows need no table.
__device__ __forceinline__ void prefetch_lookups(const DenseKV&, int, int, int) {}

}  // namespace pagekernels::cuda
