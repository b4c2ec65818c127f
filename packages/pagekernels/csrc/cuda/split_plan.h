// Split-K (flash-decoding) planner for the attention kernels. Host code, no CUDA.
//
// MLX records every launch into a CUDA graph and eval_gpu must not read device values, so the
// plan depends on SHAPES only: the key bound max_keys (max_pages * page_size, or S for dense),
// the number of CTAs without a split, and how many CTAs fit on the GPU at once. A split whose
// chunk lies past a row's real context writes an empty state (o = 0, lse = -inf) that the merge
// kernel ignores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace pagekernels::cuda {

// A chunk shorter than this costs more in launch/merge than it gains in parallelism. 256 keys
// (128 KB of bf16 K+V per kv head at D=128) as FlashInfer's single-request decode; to tune.
constexpr int kMinChunkKeys = 256;

constexpr int kMaxSplits = 65535;  // gridDim.y

// Most chunks the decode planner picks by itself. Past 8 chunks per row the merge (which walks
// a row's chunks) costs more than the extra CTAs gain: on the H200 (operator benchmark, bf16,
// Hkv 8) B=1 x 8192 took 22.9 us in 32 chunks and 18.6 us in 8, B=1 x 32768 43.6 us in 64 and
// 39.1 us in 8, with 16 and 64 chunks slower than 8 at both page sizes; at the other B = 1
// and 8 shapes measured the planner already chose at most 8.
constexpr int kMaxAutoDecodeSplits = 8;

struct SplitPlan {
  int num_splits;  // key chunks per (b, kv_head, row block)
  int chunk_keys;  // keys per chunk, a multiple of `align`
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// work: CTAs without a split; max_keys: most keys any row can see (shape bound); align: chunk
// granularity (lcm of page size and key tile); wave: CTAs resident at once (SMs x CTAs per SM);
// target_waves: split until work * splits reaches this many waves (2 for decode keeps every SM
// busy when one request's chunks end early); max_auto_splits: most chunks chosen that way;
// forced_splits: 0 = choose, n > 0 = n chunks (tests, benchmarks), clamped to what fits.
inline SplitPlan plan_splits(int64_t work, int64_t max_keys, int align, int64_t wave,
                             int target_waves, int max_auto_splits, int forced_splits) {
  max_keys = std::max<int64_t>(max_keys, 1);
  work = std::max<int64_t>(work, 1);
  const int64_t most = std::min<int64_t>(ceil_div(max_keys, align), kMaxSplits);
  int64_t splits = 1;
  if (forced_splits > 0) {
    splits = forced_splits;
  } else if (work < target_waves * wave) {
    const int64_t to_fill = target_waves * wave / work;
    const int64_t by_chunk = max_keys / kMinChunkKeys;
    splits = std::min({to_fill, by_chunk, int64_t{max_auto_splits}});
  }
  splits = std::clamp<int64_t>(splits, 1, most);
  const int64_t chunk = ceil_div(ceil_div(max_keys, splits), align) * align;
  return {static_cast<int>(ceil_div(max_keys, chunk)), static_cast<int>(chunk)};
}

// Chunk granularity: whole key tiles, and whole pages so a chunk never starts mid-page.
inline int chunk_alignment(int page_size, int key_tile) {
  const int64_t a = std::lcm<int64_t>(page_size, key_tile);
  return static_cast<int>(std::min<int64_t>(a, int64_t{1} << 20));
}

}  // namespace pagekernels::cuda
