// Split-K (flash-decoding) planner for the attention kernels. Host code, no CUDA.
//
// MLX records every launch into a CUDA graph and eval_gpu must not read device values, so the
// plan depends on SHAPES only: the key bound max_keys (max_pages * page_size, or S for dense),
// the number of CTAs without a split, and how many CTAs fit on the GPU at once. A split whose
// chunk lies past a row's real context writes an empty state (o = 0, lse = -inf) that the merge
// ignores.
//
// Chunks are whole key tiles and may start mid-page: the K/V ring resolves every key's page and
// slot on its own (kv_ring.cuh), and masks keys past the context or on unmapped pages per key.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pagekernels::cuda {

// A CTA's latency is about: one round trip for context_lens and block_table, ceil(tiles / 2)
// round trips of K/V (its ring has 2 tiles in flight from the prologue on), the store. A chunk
// of 2 tiles (128 keys at the 64-key tensor-core tile) costs the same round trips as 1 tile, so
// shorter chunks only add CTAs and partials.
constexpr int kMinChunkKeys = 128;
// A second wave repeats every CTA's fixed round trips (prologue, store, merge); it pays for
// itself only when chunks stay long (8 tiles, 4 K/V round trips), e.g. to even out a batch
// whose rows end at different lengths.
constexpr int kBalanceChunkKeys = 512;

constexpr int kMaxSplits = 65535;  // gridDim.y

struct SplitPlan {
  int num_splits;  // key chunks per (b, kv_head, row block)
  int chunk_keys;  // keys per chunk, a multiple of the key tile
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// work: CTAs without a split; max_keys: most keys any row can see (shape bound); key_tile: the
// kernel's keys per pipeline stage (chunk granularity); wave: CTAs resident at once (SMs x CTAs
// per SM); max_waves: at most this many waves, each beyond the first only with chunks of
// kBalanceChunkKeys or more (2 for decode, 1 for prefill, whose partials cost rows x D x 8
// bytes per split); forced_splits: 0 = choose, n > 0 = n chunks (tests, benchmarks), clamped to
// what fits.
inline SplitPlan plan_splits(int64_t work, int64_t max_keys, int key_tile, int64_t wave,
                             int max_waves, int forced_splits) {
  max_keys = std::max<int64_t>(max_keys, 1);
  work = std::max<int64_t>(work, 1);
  const int64_t most = std::min<int64_t>(ceil_div(max_keys, key_tile), kMaxSplits);
  int64_t splits = 1;
  if (forced_splits > 0) {
    splits = forced_splits;
  } else if (work < max_waves * wave) {
    splits = std::min(wave / work, max_keys / kMinChunkKeys);  // fill one wave
    const int64_t more = max_waves * wave / work;
    if (max_keys / more >= kBalanceChunkKeys) splits = std::max(splits, more);
  }
  splits = std::clamp<int64_t>(splits, 1, most);
  const int64_t chunk = ceil_div(ceil_div(max_keys, splits), key_tile) * key_tile;
  return {static_cast<int>(ceil_div(max_keys, chunk)), static_cast<int>(chunk)};
}

}  // namespace pagekernels::cuda
