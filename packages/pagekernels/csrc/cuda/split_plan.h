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

// Prefill's shortest chunk: its partials cost rows * splits * D * 8 bytes of traffic, so a split
// must bring enough keys (256: 128 KB of bf16 K+V per kv head at D = 128; not tuned).
constexpr int kMinChunkKeys = 256;

constexpr int kMaxSplits = 65535;  // gridDim.y

// Decode splits until the grid fills one wave of resident CTAs, in chunks of at least 128 keys
// and at most 32 chunks per row. Tuned on the H200 by the latency of one call among dependent
// ones (benchmarks/kernel_time.py, forced chunks 1-32, bf16, Hkv 8, D 128, pages of 16 and 128;
// results/h200/session16/split-sweep-4574aae): the planner's choice is the best count or within
// 8 % of it at B = 1 x 1024 (8 chunks, 8.4 us), 1 x 8192 (32: 19.0 us; 16: 17.7),
// 1 x 32768 (32: 42.5), 8 x 1024 (4: 15.9; 2 the same), 8 x 8192 (4: 70.2), 32 x 1024 and
// 32 x 8192 (1: 36.5, 245.8). Identical plans differ by 1-7 % between processes.
// (An earlier tuning, on independent calls that the GPU ran side by side, left B = 8 x 8192
// unsplit: 64 CTAs, 172 us per call alone.)
constexpr int kMinDecodeChunkKeys = 128;
constexpr int kMaxAutoDecodeSplits = 32;

struct SplitPlan {
  int num_splits;  // key chunks per (b, kv_head, row block)
  int chunk_keys;  // keys per chunk, a multiple of `align`
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// work: CTAs without a split; max_keys: most keys any row can see (shape bound); align: chunk
// granularity (lcm of page size and key tile); target_ctas: split until work * splits reaches
// this many CTAs (one wave of resident CTAs); min_chunk_keys: shortest chunk chosen that way;
// max_auto_splits: most chunks chosen that way; forced_splits: 0 = choose, n > 0 = n chunks
// (tests, benchmarks), clamped to what fits.
inline SplitPlan plan_splits(int64_t work, int64_t max_keys, int align, int64_t target_ctas,
                             int min_chunk_keys, int max_auto_splits, int forced_splits) {
  max_keys = std::max<int64_t>(max_keys, 1);
  work = std::max<int64_t>(work, 1);
  const int64_t most = std::min<int64_t>(ceil_div(max_keys, align), kMaxSplits);
  int64_t splits = 1;
  if (forced_splits > 0) {
    splits = forced_splits;
  } else if (work < target_ctas) {
    const int64_t to_fill = target_ctas / work;
    const int64_t by_chunk = max_keys / min_chunk_keys;
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
